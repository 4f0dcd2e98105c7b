"""A zoo run's end (`llmbuild zoo-page`): the recipes' results gathered into one history record, compared
with the previous run, and the pages written."""

from __future__ import annotations

from pathlib import Path

from llmbuild import LlmbuildError
from llmbuild.zoo import history, page, regressions, timeline
from llmbuild.zoo.jsonio import read_json, write_json
from llmbuild.zoo.layout import ZooPaths


def finish_run(zoo_dir: Path, run: str) -> dict:
    """Write history/<run>.json, regressions.json and the pages; returns the record."""
    paths = ZooPaths(Path(zoo_dir))
    results = {path.stem: read_json(path) for path in sorted(paths.run_dir(run).glob("*.json"))}
    if not results:
        raise LlmbuildError(f"{paths.run_dir(run)}: no recipe results for run {run} (`snakemake zoo` writes them)")
    for name, result in results.items():
        if not isinstance(result, dict) or result.get("status") not in ("verified", "failed", "skipped"):
            raise LlmbuildError(f"{paths.result(run, name)}: expected a zoo result (an object whose `status` is "
                                "verified, failed or skipped)")
    earlier = [r for r in history.load(paths) if r["run"] < run]
    previous = earlier[-1] if earlier else None
    record = history.new_record(run, results)
    record["schedule"] = _schedule(paths, run, list(results))
    record["previous"] = previous["run"] if previous else None
    record["regressions"] = regressions.find(previous, record)
    history.write(paths, record)
    write_json(paths.regressions, {"run": run, "previous": record["previous"], "regressions": record["regressions"]})
    page.write_pages(paths, record, [*earlier, record])
    return record


def _schedule(paths: ZooPaths, run: str, recipes: list[str]) -> dict | None:
    """Every job's span in the run's Snakemake run (its log), or None without a log (a run written by an
    older llmbuild, or results made by hand)."""
    log = paths.log(run)
    if not log.is_file():
        return None
    return timeline.summary(timeline.read_jobs(log.read_text(encoding="utf-8", errors="replace"), recipes))

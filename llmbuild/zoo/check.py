"""The nightly's verdict (`llmbuild zoo-check`): the regressions of the latest zoo run, one line each."""

from __future__ import annotations

from pathlib import Path

from llmbuild import LlmbuildError
from llmbuild.zoo.jsonio import read_json
from llmbuild.zoo.layout import ZooPaths


def latest_regressions(zoo_dir: Path) -> tuple[str, list[str]]:
    """(run, one line per regression) of the latest run, from regressions.json."""
    path = ZooPaths(Path(zoo_dir)).regressions
    if not path.is_file():
        raise LlmbuildError(f"{path}: no zoo run here yet (run `snakemake --cores N zoo` first)")
    summary = read_json(path)
    if not isinstance(summary, dict) or not isinstance(summary.get("regressions"), list):
        raise LlmbuildError(f"{path}: expected the zoo's regression summary (an object with `regressions`)")
    lines = [f"{r.get('recipe')}: {r.get('kind')}: {r.get('message')}" for r in summary["regressions"]]
    return str(summary.get("run")), lines

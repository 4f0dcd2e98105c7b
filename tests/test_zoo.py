"""The nightly model zoo (rules/zoo.smk, llmbuild/zoo/, docs/zoo.md): `snakemake zoo` builds every selected
recipe, a failing one never stopping the others, writes a page with a row per recipe and one history
record per run, and flags what got worse since the previous run; scripts/nightly.sh exits non-zero on it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from helpers import ROOT, llmbuild, nan_weights_recipe, snakemake

from llmbuild.zoo import regressions


class _Rows(HTMLParser):
    """recipe -> (status, the row's text) for every `tr.recipe-row` of the page (text unescaped)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, tuple[str, str]] = {}
        self._open: tuple[str, str] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "tr" and "recipe-row" in (found.get("class") or ""):
            self._open, self._text = (found["data-recipe"], found["data-status"]), []

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr" and self._open:
            self.rows[self._open[0]] = (self._open[1], " ".join("".join(self._text).split()))
            self._open = None

    def handle_data(self, data: str) -> None:
        if self._open:
            self._text.append(data)


def page_rows(page: Path) -> dict[str, tuple[str, str]]:
    parser = _Rows()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.rows


def _zoo(build: Path, *recipes: str, recipes_dir: Path | None = None) -> subprocess.CompletedProcess:
    return snakemake(build, "zoo", "--config", f"recipes=[{','.join(recipes)}]", recipes=recipes_dir, check=False)


def test_a_failing_recipe_leaves_the_others_built_and_shows_failed(tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    for name in ("_tiny_common.yaml", "qwen2_tiny_f32.yaml"):
        shutil.copy(ROOT / "recipes" / name, recipes / name)
    # Refused when the recipe loads, and at run time by its first step: neither may stop qwen2_tiny_f32.
    (recipes / "broken_tiny.yaml").write_text("base: qwen2_tiny_f32\nstages:\n  seq_length: big\n")
    nan_weights_recipe(recipes, tmp_path / "nan_checkpoint")
    build = tmp_path / "build"

    result = _zoo(build, "broken_tiny", "nan_weights", "qwen2_tiny_f32", recipes_dir=recipes)
    assert result.returncode == 0, result.stderr[-3000:]

    assert (build / "qwen2_tiny_f32" / "qwen2_tiny_f32.llmb").is_file()  # built although the others failed
    rows = page_rows(build / "zoo" / "index.html")
    assert set(rows) == {"broken_tiny", "nan_weights", "qwen2_tiny_f32"}
    assert rows["qwen2_tiny_f32"][0] == "verified"
    status, text = rows["broken_tiny"]
    assert status == "failed" and "recipe: " in text
    assert "broken_tiny.yaml:3: stages.seq_length: expected an integer, got string 'big'" in text, text
    status, text = rows["nan_weights"]
    assert status == "failed" and "prepare: llmbuild: error: " in text, text
    assert "model.layers.1.self_attn.o_proj.weight" in text and "NaN or Inf" in text, text
    assert not (build / "nan_weights" / "spec.json").exists()

    (record,) = [json.loads(p.read_text()) for p in (build / "zoo" / "history").glob("*.json")]
    built = record["recipes"]["qwen2_tiny_f32"]
    assert built["binary_bytes"] == (build / "qwen2_tiny_f32" / "qwen2_tiny_f32.llmb").stat().st_size
    assert {"prepare", "reference", "link", "verify"} <= set(built["rules"])
    assert all(r["seconds"] is not None for r in built["rules"].values())
    # Snakemake's benchmark samples memory every few tenths of a second: a job that ends first (plan and
    # verify can, in 0.2 s) has none recorded. The reference runs for seconds.
    assert built["rules"]["reference"]["max_rss_mb"]
    layers = {n["layer"] for n in built["nets"] if isinstance(n["layer"], int)}
    assert layers == {0, 1, 2, 3} and {n["stage"] for n in built["nets"]} >= {"prefill", "prefill_kv", "decode"}
    assert built["chip"]["decode_tokens_per_s"] > 0 and built["tokens"] and built["host_tokens_per_s"] > 0
    assert record["git"]["revision"] and record["versions"]["snakemake"] and record["previous"] is None
    assert (build / "zoo" / "recipes" / "nan_weights.html").is_file()
    page = (build / "zoo" / "index.html").read_text()
    assert '<script src="plotly.min.js"></script>' in page and "cdn" not in page.lower()
    assert (build / "zoo" / "plotly.min.js").stat().st_size > 1_000_000

    # One Snakemake run built every buildable recipe (the broken one never got a job): its log gives the
    # schedule the page plots.
    schedule = record["schedule"]
    assert {j["recipe"] for j in schedule["jobs"]} >= {"qwen2_tiny_f32", "nan_weights"}, schedule["jobs"]
    assert [j["rule"] for j in schedule["jobs"] if j["failed"]] == ["prepare"], schedule["jobs"]
    assert not any(j["recipe"] == "broken_tiny" for j in schedule["jobs"])
    assert schedule["max_in_flight"] >= 2 and schedule["wall_seconds"] > 0
    assert 'id="plot-in-flight"' in page


def _nightly(build: Path, *args: str, bmodel: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, LLMBUILD_BUILD_DIR=str(build), LLMBUILD_NIGHTLY_CORES="2", HF_HUB_OFFLINE="1")
    env.pop("LLMBUILD_RECIPES", None)
    if not bmodel:  # the claim is the regression check's, not the vendor binary's: half the build's time
        env["LLMBUILD_BMODEL"] = "0"
    return subprocess.run([str(ROOT / "scripts" / "nightly.sh"), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)


def test_a_regression_shows_on_the_page_and_fails_the_nightly(tmp_path: Path) -> None:
    build = tmp_path / "build"
    first = _nightly(build, "--config", "recipes=[qwen2_tiny_f32]", bmodel=False)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert "no regression" in first.stdout

    # A margin that dropped (the device's worst cosine lower, still passing) and a slower step, injected
    # into the build's own results: the second run rebuilds nothing and reads them back.
    verify = build / "qwen2_tiny_f32" / "verify.json"
    report = json.loads(verify.read_text())
    assert report["worst_cosine"]["tpu_vs_top"] > report["tolerances"]["tpu_cosine"]
    report["worst_cosine"]["tpu_vs_top"] = report["tolerances"]["tpu_cosine"]  # no margin left, still passing
    verify.write_text(json.dumps(report))
    tsv = build / "qwen2_tiny_f32" / "benchmarks" / "reference.tsv"
    header, row = tsv.read_text().splitlines()[:2]
    values = row.split("\t")
    values[0] = str(float(values[0]) + 100.0)
    tsv.write_text(f"{header}\n{chr(9).join(values)}\n")

    second = _nightly(build, "--config", "recipes=[qwen2_tiny_f32]", bmodel=False)
    assert second.returncode == 1, second.stdout[-2000:] + second.stderr[-3000:]
    assert "qwen2_tiny_f32: margin dropped: tpu_vs_top margin" in second.stdout, second.stdout[-2000:]
    assert "qwen2_tiny_f32: build slower: " in second.stdout and "most in reference" in second.stdout

    summary = json.loads((build / "zoo" / "regressions.json").read_text())
    assert sorted(r["kind"] for r in summary["regressions"]) == ["build slower", "margin dropped"]
    records = sorted((build / "zoo" / "history").glob("*.json"))
    assert len(records) == 2 and json.loads(records[1].read_text())["previous"] == records[0].stem
    page = (build / "zoo" / "index.html").read_text()
    assert 'class="regressions"' in page and 'data-kind="margin dropped"' in page and 'data-kind="build slower"' in page


def _result(status: str = "verified", **changes: object) -> dict:
    result = {"status": status, "step": None, "message": None, "margins": {"tpu_vs_top": 1e-3, "logits": 2e-3},
              "tokens": [5, 6, 7], "build_seconds": 20.0, "binary_bytes": 1000,
              "rules": {"layers_0-1": {"seconds": 10.0}, "verify": {"seconds": 10.0}}}
    return {**result, **changes}


def _record(run: str, **recipes: dict) -> dict:
    return {"run": run, "recipes": recipes}


@pytest.mark.parametrize(("now", "kind"), [
    (_result("failed", step="layers_0-1", message="llmbuild: error: x"), "stopped building"),
    (_result(margins={"tpu_vs_top": 1e-3, "logits": 1e-3}), "margin dropped"),
    (_result(tokens=[5, 6, 8]), "tokens changed"),
    (_result(build_seconds=23.0, rules={"layers_0-1": {"seconds": 13.0}, "verify": {"seconds": 10.0}}),
     "build slower"),
    (_result(binary_bytes=1101), "binary larger"),
])
def test_each_kind_of_regression(now: dict, kind: str) -> None:
    found = regressions.find(_record("1", a=_result()), _record("2", a=now))
    assert [r["kind"] for r in found] == [kind], found
    assert found[0]["recipe"] == "a"


def test_what_is_not_a_regression() -> None:
    before = _record("1", a=_result(), b=_result("failed"), gone=_result())
    assert regressions.find(None, before) == []  # a first run
    same = _record("2", a=_result(build_seconds=20.9, binary_bytes=1100), b=_result("failed"), new=_result("failed"))
    assert regressions.find(before, same) == []  # within 10% or under a second; still failing; new; gone
    assert [r["kind"] for r in regressions.find(before, _record("3", a=_result(build_seconds=21.5)))] == []
    faster = _record("4", a=_result(build_seconds=10.0, margins={"tpu_vs_top": 2e-3, "logits": 2e-3}))
    assert regressions.find(before, faster) == []


def test_bad_zoo_files_are_one_line_errors(tmp_path: Path) -> None:
    zoo = tmp_path / "build" / "zoo"
    result = llmbuild(tmp_path / "build", "zoo-check", str(zoo))
    assert result.returncode == 2 and result.stderr.startswith("llmbuild: error: ")
    assert "no zoo run here yet" in result.stderr and len(result.stderr.splitlines()) == 1

    (zoo / "runs" / "20260101T000000Z").mkdir(parents=True)
    (zoo / "runs" / "20260101T000000Z" / "a.json").write_text(json.dumps({"status": "failed"}))
    (zoo / "history").mkdir()
    (zoo / "history" / "20251231T000000Z.json").write_text('{"run": "x", "recipes": {')
    result = llmbuild(tmp_path / "build", "zoo-page", str(zoo), "--run", "20260101T000000Z")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == (f"llmbuild: error: {zoo / 'history' / '20251231T000000Z.json'}:1: not valid "
                                      "JSON (Expecting property name enclosed in double quotes)")


def test_a_failure_without_a_step_message_names_the_rule(tmp_path: Path) -> None:
    """A step killed before it could say why (out of memory, a signal) left no `llmbuild: error:` line: the
    outcome names the rule Snakemake reports for this recipe and says there was no message, rather than
    passing as built; another recipe's failure in the same run is not taken for its own."""
    from llmbuild.zoo.build import failure

    log = tmp_path / "r" / "logs" / "layers_0-1.log"
    log.parent.mkdir(parents=True)
    log.write_text("compiling layer 0\nKilled\n")
    output = (f"[Sat Dec  5 10:00:00 2026]\nlocalrule layers_r_0_1:\n    output: {tmp_path}/r/layers/0\n    jobid: 3\n"
              f"[Sat Dec  5 10:00:00 2026]\nlocalrule prepare:\n    output: {tmp_path}/other/spec.json\n    jobid: 4\n"
              "    wildcards: recipe=other\n"
              "[Sat Dec  5 10:00:01 2026]\nError in rule prepare:\n    jobid: 4\n"
              "[Sat Dec  5 10:00:02 2026]\nError in rule layers_r_0_1:\n    jobid: 3\n"
              "Shutting down, this might take some time.\n")
    step, message = failure(tmp_path, "r", 0.0, output, 1)
    assert (step, message) == ("layers_r_0_1", "snakemake exited with status 1 and no step message (see the zoo log)")

    log.write_text("compiling layer 0\nllmbuild: error: r.yaml:3: stages.seq_length: too long\n")
    assert failure(tmp_path, "r", 0.0, output, 1) == ("layers_0-1", "llmbuild: error: r.yaml:3: stages.seq_length: "
                                                                     "too long")
    step, message = failure(tmp_path, "q", 0.0, "Building DAG of jobs...\nLockException: the folder is locked\n", 1)
    assert step == "snakemake" and "LockException: the folder is locked" in message, message


def test_the_schedule_is_read_from_the_snakemake_log() -> None:
    """Two recipes' jobs overlapping in one run: each job's span and recipe (its wildcard, its paths, or
    the recipe's own target), a failed job ended by its error, and the jobs in flight per recipe."""
    from llmbuild.zoo import timeline

    log = ("Building DAG of jobs...\n"
           "[Sat Dec  5 10:00:00 2026]\nrule prepare:\n    output: /b/a/spec.json\n    jobid: 1\n"
           "    wildcards: recipe=a\n    resources: mem_mb=220\nJob 1 has been submitted with SLURM jobid 7.\n"
           "[Sat Dec  5 10:00:00 2026]\nrule layers_b_0_1:\n    input: /b/a/spec.json\n    output: /b/b/layers/0\n"
           "    log: /b/b/logs/layers_0-1.log\n    jobid: 2\n"
           "[Sat Dec  5 10:00:04 2026]\nFinished jobid: 1 (Rule: prepare)\n"
           "[Sat Dec  5 10:00:05 2026]\nlocalrule a:\n    input: /b/a/verify.json\n    jobid: 3\n"
           "[Sat Dec  5 10:00:06 2026]\nError in rule layers_b_0_1:\n    message: None\n    jobid: 2\n"
           "[Sat Dec  5 10:00:06 2026]\nFinished jobid: 3 (Rule: a)\n")
    jobs = timeline.read_jobs(log, ["a", "b"])
    assert [(j.rule, j.recipe, j.local, j.start, j.end, j.failed) for j in jobs] == [
        ("prepare", "a", False, 0.0, 4.0, False), ("layers_b_0_1", "b", False, 0.0, 6.0, True),
        ("a", "a", True, 5.0, 6.0, False)]
    assert [j.slurm_id for j in jobs] == ["7", None, None]
    assert timeline.in_flight(jobs) == [(0.0, {"a": 1, "b": 1}), (4.0, {"a": 0, "b": 1}), (5.0, {"a": 1, "b": 1}),
                                        (6.0, {"a": 0, "b": 0})]
    summary = timeline.summary(jobs)
    assert (summary["wall_seconds"], summary["max_in_flight"], summary["max_recipes_in_flight"]) == (6.0, 2, 2)
    assert [timeline.Job.of(j) for j in summary["jobs"]] == [timeline.Job(**{**vars(j), "outputs": ""}) for j in jobs]


def test_a_recipe_whose_dag_cannot_be_made_fails_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One recipe's error while the zoo's run makes its DAG stops that run before any job: each recipe is
    then run alone, and only that recipe is failed (the other's marker is made; its build folder here has
    no verify.json, so it reads as not passed)."""
    from llmbuild.zoo.build import build_zoo

    snakefile = tmp_path / "Snakefile"
    snakefile.write_text(
        "def needs(w):\n"
        "    if w.recipe == 'llama_tiny_f32':\n"
        "        raise ValueError('llama_tiny_f32: no plan for this recipe')\n"
        "    return []\n\n"
        "rule zoo_built:\n    input: needs\n    output: touch('{zoo}/runs/{run}/{recipe}.built')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLMBUILD_RECIPES", str(ROOT / "recipes"))
    monkeypatch.delenv("LLMBUILD_ZOO_SNAKEMAKE_ARGS", raising=False)
    names = ["qwen2_tiny_f32", "llama_tiny_f32"]
    results = build_zoo(names, tmp_path / "build", tmp_path / "build" / "zoo", "20260101T000000Z", snakefile, 1)
    assert (tmp_path / "build" / "zoo" / "runs" / "20260101T000000Z" / "qwen2_tiny_f32.built").is_file()
    assert (results["qwen2_tiny_f32"]["status"], results["qwen2_tiny_f32"]["step"]) == ("failed", "verify")
    failed = results["llama_tiny_f32"]
    assert (failed["status"], failed["step"]) == ("failed", "snakemake"), failed
    assert "no plan for this recipe" in failed["message"], failed

"""Snakemake's scheduling loop in a local run: one pass per job event once the default rate limit is
dropped (llmbuild/steps/scheduling.py), against the chains of timed passes it makes with the limit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from llmbuild.steps.scheduling import drop_default_rate_limit

JOBS = 6
# Each job sleeps past the limit's one-second timespan, so its timers fire while jobs run.
SNAKEFILE = f"""
PASSES = [0]

onstart:
    from llmbuild.steps.scheduling import drop_default_rate_limit

    if config.get("drop"):
        drop_default_rate_limit(workflow)
    selector = workflow.scheduler.job_selector

    def counted(jobs):
        PASSES[0] += 1
        return selector(jobs)

    workflow.scheduler.job_selector = counted


onsuccess:
    with open("passes.txt", "w") as out:
        out.write(str(PASSES[0]))


rule all:
    input: [f"out/{{i}}.txt" for i in range({JOBS})]


rule one:
    output: "out/{{i}}.txt"
    shell: "sleep 1.3; touch {{output}}"
"""


def _limiter(max_jobs: int, timespan: float) -> SimpleNamespace:
    return SimpleNamespace(max_jobs=max_jobs, timespan=timespan)


def _workflow(limiter: SimpleNamespace | None, local: bool = True) -> SimpleNamespace:
    return SimpleNamespace(local_exec=local, scheduler=SimpleNamespace(job_rate_limiter=limiter))


def test_only_a_local_runs_default_limit_is_dropped():
    local = _workflow(_limiter(100, 1.0))
    assert drop_default_rate_limit(local) and local.scheduler.job_rate_limiter is None
    own = _workflow(_limiter(10, 1.0))  # a limit the user gave
    assert not drop_default_rate_limit(own) and own.scheduler.job_rate_limiter is not None
    cluster = _workflow(_limiter(100, 1.0), local=False)
    assert not drop_default_rate_limit(cluster) and cluster.scheduler.job_rate_limiter is not None
    assert not drop_default_rate_limit(_workflow(None))
    assert not drop_default_rate_limit(SimpleNamespace(local_exec=True))  # no scheduler yet


def _passes(tmp_path: Path, drop: bool) -> int:
    work = tmp_path / ("dropped" if drop else "limited")
    work.mkdir()
    (work / "Snakefile").write_text(SNAKEFILE)
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", "--scheduler", "greedy", "--config",
         f"drop={int(drop)}"], cwd=work, capture_output=True, text=True, timeout=300,
        env={"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "PYTHONPATH": str(root),
             "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    return int((work / "passes.txt").read_text())


def test_a_local_run_makes_one_scheduling_pass_per_job_event(tmp_path):
    # Without the limit: a pass when the run starts and one per finished job, at most.
    dropped = _passes(tmp_path, drop=True)
    assert dropped <= JOBS + 1
    # With it (Snakemake's own behaviour, the reason for the hook): each finished job adds a chain of
    # passes timed a second apart, so the same run makes more, and more the longer it runs.
    # (6 against 10 when measured; a slower machine only adds timed passes.)
    assert _passes(tmp_path, drop=False) >= dropped + 3

"""Every recipe of a zoo run built in one Snakemake run, each one's outcome recorded, nothing raised.

Why one run with --keep-going: one DAG holds every recipe's steps, so the executor sees all of them at
once and orders them by priority and resources (on a cluster, jobs of several recipes are queued
together); --keep-going, given here and not in the workflow profile, lets one recipe's failure leave the
others building while an everyday `snakemake RECIPE` still stops at its first failure. Its targets are
the recipes' `zoo_built` markers (rules/zoo.smk), made only when all of a recipe's steps succeeded: a
recipe without its marker failed, and the failing step and its message come from the step logs written
during this run and from the run's own report.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from llmbuild import LlmbuildError
from llmbuild.steps.dag import recipe_problems
from llmbuild.steps.failures import MARKERS, step_errors
from llmbuild.zoo.collect import collect
from llmbuild.zoo.layout import ZooPaths
from llmbuild.zoo.timeline import read_jobs

# Extra options for the zoo's Snakemake run, e.g. "--profile profiles/slurm --workflow-profile none" to
# build on a cluster.
EXTRA_ARGS_ENV = "LLMBUILD_ZOO_SNAKEMAKE_ARGS"
_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception): \S")


def build_zoo(names: list[str], build_dir: Path, zoo_dir: Path, run: str, snakefile: Path, cores: int) -> dict:
    """recipe -> its result: status `verified`, `failed` (with `step` and `message`) or `skipped`."""
    results = _unbuildable(names)
    buildable = [name for name in names if name not in results]
    paths = ZooPaths(Path(zoo_dir))
    if buildable:
        started = time.time()
        returncode, output = _run(_command(snakefile, cores, [paths.built(run, name) for name in buildable]))
        if returncode != 0 and len(buildable) > 1 and not read_jobs(output):
            # The run stopped before any job (one recipe's DAG could not be made): each recipe alone, so
            # that one's error is its failure only.
            for name in buildable:
                started = time.time()
                returncode, output = _run(_command(snakefile, cores, [paths.built(run, name)]))
                results[name] = outcome(name, Path(build_dir), paths.built(run, name), started, output, returncode)
        for name in buildable:
            if name not in results:
                results[name] = outcome(name, Path(build_dir), paths.built(run, name), started, output, returncode)
    return {name: results[name] for name in names}


def _command(snakefile: Path, cores: int, targets: list[Path]) -> list[str]:
    # --rerun-incomplete: a zoo killed half-way (the machine rebooted) must not fail the next night's run.
    return [sys.executable, "-m", "snakemake", "--snakefile", str(snakefile), "--cores", str(cores), "--keep-going",
            "--rerun-incomplete", *shlex.split(os.environ.get(EXTRA_ARGS_ENV, "")), *map(str, targets)]


def outcome(name: str, build_dir: Path, marker: Path, since: float, output: str, returncode: int) -> dict:
    """One recipe's result after the zoo's run: built when its marker is there, else failed."""
    if not marker.is_file():
        step, message = failure(build_dir, name, since, output, returncode)
        return {"recipe": name, "status": "failed", "step": step, "message": message,
                "attempt_seconds": round(time.time() - since, 1)}
    # The marker is made right after the recipe's last step: when, within this run, the recipe was done.
    result = {"recipe": name, "attempt_seconds": round(max(0.0, marker.stat().st_mtime - since), 1)}
    try:
        results = collect(build_dir, name)
    except (LlmbuildError, OSError) as exc:  # a result file the page cannot read: this recipe's failure only
        return {**result, "status": "failed", "step": "zoo", "message": str(exc)}
    if not results["verify"]["passed"]:
        return {**result, **results, "status": "failed", "step": "verify", "message": "verify.json: not passed"}
    return {**result, **results, "status": "verified", "step": None, "message": None}


def outcome_line(result: dict) -> str:
    """`recipe: status` and, for a failure or a skip, the step and its message."""
    step = f" at {result['step']}: {result['message']}" if result.get("step") else ""
    return f"{result['recipe']}: {result['status']}{step}"


def failure(build_dir: Path, name: str, since: float, output: str, returncode: int) -> tuple[str, str]:
    """(step, one-line message): the first step of this recipe that left an llmbuild message in its log
    during this run; else the first of its jobs that the run's report says failed, with the last llmbuild
    line naming the recipe; else what the run as a whole said."""
    own = [(log, message) for log, message in step_errors(build_dir, since) if log.parent.parent.name == name]
    if own:
        log, message = own[0]
        return log.stem, message
    failed = [job for job in read_jobs(output, [name]) if job.failed and job.recipe == name]
    mentions = [line.strip() for line in output.splitlines()
                if line.startswith(MARKERS) and (f"/{name}/" in line or f" {name}" in line)]
    if failed:
        return failed[0].rule, (mentions[-1] if mentions else
                                f"snakemake exited with status {returncode} and no step message (see the zoo log)")
    # Snakemake's own error (e.g. `ValueError: ...` raised making the DAG, `Error: Directory cannot be
    # locked.`), else its last line.
    said = [line.strip() for line in output.splitlines() if line.strip()]
    error = next((line for line in said if _ERROR_LINE.match(line)), said[-1] if said else "no output")
    return "snakemake", (mentions[-1] if mentions else f"snakemake exited with status {returncode} before building "
                         f"it: {error} (see the zoo log)")


def _unbuildable(names: list[str]) -> dict[str, dict]:
    """The results of the recipes that cannot start: skipped without a checkpoint, failed when they do not
    load (each asked alone if asking for all of them at once raised: a loader bug is one recipe's failure)."""
    try:
        missing, broken = recipe_problems(names)
    except Exception:  # noqa: BLE001 - found out per recipe below
        missing, broken = {}, {}
        for name in names:
            try:
                one_missing, one_broken = recipe_problems([name])
            except Exception as exc:  # noqa: BLE001 - a loader bug on one recipe must not stop the zoo
                broken[name] = f"llmbuild: internal error: {type(exc).__name__}: {exc}"
                continue
            missing.update(one_missing)
            broken.update(one_broken)
    results = {name: {"recipe": name, "status": "skipped", "step": "checkpoint", "message": message}
               for name, message in missing.items() if name in names}
    results.update({name: {"recipe": name, "status": "failed", "step": "recipe", "message": message}
                    for name, message in broken.items() if name in names})
    return results


def _run(command: list[str]) -> tuple[int, str]:
    """Run it with its output passed through line by line (the zoo log shows progress) and kept."""
    lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace") as process:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
    return process.returncode, "".join(lines)

"""One recipe tried for the zoo: built by a Snakemake run of its own, its outcome recorded, never raised.

Why a Snakemake run per recipe: a failing job stops a Snakemake run (unless --keep-going, which the
workflow profile leaves off for everyday builds), so the zoo gives each recipe a run of its own, started
by that recipe's `zoo_recipe` job (rules/zoo.smk), and records the exit status and the failing step's
message where the outer run would have stopped.
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

# Extra options for each recipe's Snakemake run, e.g. "--profile profiles/slurm" to build on a cluster.
EXTRA_ARGS_ENV = "LLMBUILD_ZOO_SNAKEMAKE_ARGS"
_FAILED_RULE = re.compile(r"Error in rule (\S+?):")


def attempt(name: str, build_dir: Path, snakefile: Path, cores: int) -> dict:
    """The recipe's result: status `verified`, `failed` (with `step` and `message`) or `skipped`."""
    try:
        missing, broken = recipe_problems([name])
    except Exception as exc:  # noqa: BLE001 - a loader bug on one recipe must not stop the zoo: it is its failure
        return {"recipe": name, "status": "failed", "step": "recipe",
                "message": f"llmbuild: internal error: {type(exc).__name__}: {exc}"}
    if name in missing:
        return {"recipe": name, "status": "skipped", "step": "checkpoint", "message": missing[name]}
    if name in broken:
        return {"recipe": name, "status": "failed", "step": "recipe", "message": broken[name]}
    started = time.time()
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(snakefile), "--cores", str(cores),
               *shlex.split(os.environ.get(EXTRA_ARGS_ENV, "")), name]
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    sys.stdout.write(run.stdout)  # the job's log keeps the whole Snakemake report
    sys.stderr.write(run.stderr)
    outcome = {"recipe": name, "attempt_seconds": round(time.time() - started, 1)}
    if run.returncode != 0:
        step, message = _failure(Path(build_dir), name, started, run.stdout + run.stderr, run.returncode)
        return {**outcome, "status": "failed", "step": step, "message": message}
    try:
        results = collect(Path(build_dir), name)
    except (LlmbuildError, OSError) as exc:  # a result file the page cannot read: this recipe's failure only
        return {**outcome, "status": "failed", "step": "zoo", "message": str(exc)}
    if not results["verify"]["passed"]:
        return {**outcome, **results, "status": "failed", "step": "verify", "message": "verify.json: not passed"}
    return {**outcome, **results, "status": "verified", "step": None, "message": None}


def outcome_line(result: dict) -> str:
    """`recipe: status` and, for a failure or a skip, the step and its message."""
    step = f" at {result['step']}: {result['message']}" if result.get("step") else ""
    return f"{result['recipe']}: {result['status']}{step}"


def _failure(build_dir: Path, name: str, since: float, output: str, returncode: int) -> tuple[str, str]:
    """(step, one-line message): the first step of this recipe that left an llmbuild message in its log
    during this attempt; else the rule Snakemake names and the last llmbuild line it printed."""
    own = [(log, message) for log, message in step_errors(build_dir, since) if log.parent.parent.name == name]
    if own:
        log, message = own[0]
        return log.stem, message
    rule = _FAILED_RULE.search(output)
    lines = [line.strip() for line in output.splitlines() if line.startswith(MARKERS)]
    message = lines[-1] if lines else f"snakemake exited with status {returncode} and no step message (see the zoo log)"
    return (rule.group(1) if rule else "snakemake"), message

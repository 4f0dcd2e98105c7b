"""The zoo's wall time and its jobs in flight over time, on one machine and on the local SLURM cluster.

    python benchmarks/zoo_scale.py [--recipes a,b,c] [--cores N] [--slurm] [--baseline-checkout DIR]
                                   [--json OUT] [--record benchmarks/records/zoo_scale.json]

Each case builds the zoo of the given tiny recipes from a clean build folder (`snakemake --cores N zoo`,
no vendor bmodel) and reads the run's schedule from its history record (the jobs' spans from the zoo's
Snakemake log, llmbuild/zoo/timeline.py): the wall time, how many jobs and how many recipes had a job in
flight at most, and the jobs in flight over time (--json; the zoo page plots the same series).

--slurm adds the same zoo sent to the local cluster (scripts/slurm-local.sh start, as root): the zoo's run
gets `--profile profiles/slurm`, and SLURM's job-completion record (`sacct -c`) gives each job's end, so
the table also says how long Snakemake took to see a finished job (the status-polling cost per job).

--baseline-checkout DIR first builds the same zoo from another checkout of llmbuild (e.g. a `git worktree`
of an earlier commit), in the same invocation and on the same machine, for a before/after comparison;
a checkout whose zoo writes no schedule has no in-flight figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from llmbuild.zoo import timeline  # noqa: E402

RECIPES = ("qwen2_tiny_f32", "llama_tiny_f32", "qwen3_tiny_f32")
COLUMNS = ["case", "llmbuild", "recipes verified", "jobs", "wall s", "most jobs in flight",
           "most recipes in flight", "status seen after the job ended, s (mean / max)"]


def run_zoo(checkout: Path, build: Path, recipes: list[str], cores: int, zoo_args: str = "") -> dict:
    """Build the zoo from `checkout` into `build`; its wall time and the run's history record."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMBUILD_")}
    env.update(LLMBUILD_BUILD_DIR=str(build), LLMBUILD_BMODEL="0", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(checkout))
    if zoo_args:
        env["LLMBUILD_ZOO_SNAKEMAKE_ARGS"] = zoo_args
    command = [sys.executable, "-m", "snakemake", "--cores", str(cores), "zoo", "--config",
               f"recipes=[{','.join(recipes)}]"]
    started = time.monotonic()
    result = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"zoo_scale.py: the zoo failed in {checkout}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    (record_path,) = sorted((build / "zoo" / "history").glob("*.json"))
    record = json.loads(record_path.read_text())
    # The zoo's one run's log; an older zoo's, a log per recipe's run.
    logs = sorted((build / "zoo" / "runs").glob("*.log")) or sorted((build / "zoo" / "runs").glob("*/*.log"))
    return {"wall": wall, "record": record, "logs": [log.read_text() for log in logs]}


def read_logs(logs: list[str], recipes: list[str]) -> tuple[list[timeline.Job], list[float]]:
    """Every job of the logs on one clock (from the first log's first job), and each SLURM job's status
    delay (seconds from its end in SLURM's record to Snakemake seeing it end)."""
    origins = [timeline.first_date(log) for log in logs]
    known = [o for o in origins if o is not None]
    first = min(known) if known else 0.0
    jobs, delays = [], []
    for log, origin in zip(logs, origins, strict=True):
        if origin is None:
            continue
        ones = timeline.read_jobs(log, recipes)
        if any(job.slurm_id for job in ones):
            delays += status_delays(origin, ones)
        for job in ones:
            job.start += origin - first
            job.end = None if job.end is None else job.end + origin - first
        jobs += ones
    return jobs, delays


def slurm_ends() -> dict[str, float]:
    """SLURM job id -> when it ended (seconds since the epoch), from the job-completion record."""
    out = subprocess.run(["sacct", "-c", "--noheader", "--parsable2", "--format=JobID,End"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    ends = {}
    for line in out.splitlines():
        job_id, _, end = line.partition("|")
        if end and end[0].isdigit():
            ends[job_id] = datetime.fromisoformat(end).timestamp()
    return ends


def status_delays(origin: float, jobs: list[timeline.Job]) -> list[float]:
    """For each SLURM job of one log (times from `origin`): seconds from its end in SLURM's record to
    Snakemake seeing it end (the log has whole seconds, so each figure is within a second)."""
    ends = slurm_ends()
    return [origin + job.end - ends[job.slurm_id] for job in jobs if job.slurm_id in ends and job.end is not None]


def row(case: str, checkout: Path, recipes: list[str], outcome: dict) -> tuple[list, dict]:
    record = outcome["record"]
    verified = sum(1 for r in record["recipes"].values() if r.get("status") == "verified")
    jobs, delays = read_logs(outcome["logs"], recipes)
    # The zoo's bookkeeping jobs and the recipes' own targets: no command, nothing in flight.
    jobs = [job for job in jobs if not job.rule.startswith("zoo") and job.rule not in recipes]
    schedule = timeline.summary(jobs) if jobs else None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True,
                            text=True).stdout.strip() or "?"
    series = [(t, sum(c.values())) for t, c in timeline.in_flight(jobs)]
    return ([case, commit, f"{verified} of {len(recipes)}", len(jobs) or None, round(outcome["wall"], 1),
             schedule["max_in_flight"] if schedule else None, schedule["max_recipes_in_flight"] if schedule else None,
             f"{statistics.mean(delays):.1f} / {max(delays):.1f}" if delays else None],
            {"case": case, "commit": commit, "wall_s": outcome["wall"], "in_flight": series,
             "status_delays_s": delays})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--slurm", action="store_true", help="also on the local SLURM (scripts/slurm-local.sh)")
    parser.add_argument("--baseline-checkout", type=Path, help="first the same zoo from this checkout")
    parser.add_argument("--json", type=Path, help="every case's jobs in flight over time and status delays")
    parser.add_argument("--record", type=Path, help="also write the table as a benchmark record here")
    args = parser.parse_args()
    recipes = args.recipes.split(",")
    if args.slurm and subprocess.run([str(ROOT / "scripts" / "slurm-local.sh"), "status"],
                                     capture_output=True).returncode != 0:
        sys.exit("zoo_scale.py: the local SLURM does not run (scripts/slurm-local.sh start, as root)")

    slurm = ("--profile profiles/slurm --workflow-profile none --cores 256 "
             f"--slurm-jobname-prefix zoo-scale-{uuid.uuid4().hex[:8]}")
    checkouts = [("before", args.baseline_checkout.resolve())] if args.baseline_checkout else []
    checkouts.append(("after" if args.baseline_checkout else "", ROOT))
    cases = [(f"one machine{', ' + when if when else ''}", checkout, "") for when, checkout in checkouts]
    if args.slurm:
        cases += [(f"local SLURM{', ' + when if when else ''}", checkout, slurm) for when, checkout in checkouts]
    rows, series = [], []
    with tempfile.TemporaryDirectory(prefix="zoo-scale-") as scratch:
        for i, (case, checkout, zoo_args) in enumerate(cases):
            outcome = run_zoo(checkout, Path(scratch) / f"build{i}", recipes, args.cores, zoo_args)
            table_row, data = row(case, checkout, recipes, outcome)
            rows.append(table_row)
            series.append(data)
            print(" | ".join("" if v is None else str(v) for v in table_row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(series, indent=1))
    if args.record:
        write_zoo_record(args.record, rows, recipes, args.cores, recorded_command(args, rows[0][1]))


def recorded_command(args: argparse.Namespace, baseline_commit: str) -> str:
    """This command as the record keeps it: no machine path (the --json file left out, the baseline
    checkout named by its commit)."""
    from records import command_line

    argv, skip = [], False
    for word in sys.argv:
        if skip:
            skip = False
        elif word == "--json":
            skip = True
        elif not word.startswith("--json="):
            argv.append(word)
    command = command_line(argv)
    if args.baseline_checkout:
        command = command.replace(str(args.baseline_checkout), f"CHECKOUT_OF_{baseline_commit}")
    return command


def write_zoo_record(path: Path, rows: list[list], recipes: list[str], cores: int, command: str) -> None:
    from records import write_record

    write_record(
        path, command=command, name=path.stem, section="the zoo", title="The zoo's schedule",
        caption=(f"`snakemake --cores {cores} zoo` of {', '.join(recipes)} from a clean build folder "
                 "(no vendor bmodel): the wall time, and the most jobs and recipes in flight at once, from the "
                 "zoo's Snakemake log (on SLURM, in flight = submitted and not yet seen ended). On the local "
                 "SLURM (one node, the machine's cores) the zoo's run has `--profile profiles/slurm`; the last "
                 "column is how long after a job's end in SLURM's record Snakemake saw it (the status checks)."),
        columns=COLUMNS, rows=rows, notes=[
            "Before: each recipe built by a Snakemake run of its own, one recipe after the other. After: every "
            "recipe's steps in one run's DAG (docs/zoo.md).",
            "Status checks: the profile's 2 s, which the SLURM plugin grows by 10 s after each check in which "
            "no job ended (not configurable in its version 2.8); with more jobs in flight, more checks see one "
            "end and the interval drops back to 2 s.",
            "A SLURM job of a tiny recipe's step takes 8 to 10 s where the step alone takes 1 to 3 s: Snakemake "
            "starts again inside each job. That, not the status checks, is most of the cluster's overhead here.",
            "The machine is shared with other work: wall times vary by some 10-20% between runs."])

if __name__ == "__main__":
    main()

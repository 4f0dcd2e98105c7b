"""Snakemake's scheduling loop in one build: how many passes it makes and what its own process costs.

    python benchmarks/scheduling_passes.py RECIPE [--limit 99/1s] [--build-dir DIR]

Builds RECIPE from a clean directory with `snakemake --cores 2 RECIPE` run inside this process, counting
the scheduler's job selections (one per pass of its loop) and the seconds they take, then prints them with
the process's own user and system CPU (the jobs are other processes) and the wall time. The workflow drops
Snakemake's default job rate limit in a local run (llmbuild/steps/scheduling.py); `--limit` gives one it
keeps (99/1s behaves as the default 100/1s does), to see a build under a limit. docs/performance.md has the
1.5B's figures both ways.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--limit", help="--max-jobs-per-timespan for Snakemake (e.g. 99/1s)")
    ap.add_argument("--build-dir", type=Path, default=Path(os.environ.get("LLMBUILD_BUILD_DIR", ROOT / "build")))
    args = ap.parse_args()
    os.environ["LLMBUILD_BUILD_DIR"] = str(args.build_dir.resolve())
    shutil.rmtree(args.build_dir / args.recipe, ignore_errors=True)

    from snakemake.cli import main as snakemake_main
    from snakemake.scheduling.job_scheduler import JobScheduler

    passes, selecting = [0], [0.0]
    select = JobScheduler.job_selector

    def counted(self, jobs):  # noqa: ANN001, ANN202 (Snakemake's own signature)
        started = time.perf_counter()
        try:
            return select(self, jobs)
        finally:
            passes[0] += 1
            selecting[0] += time.perf_counter() - started

    JobScheduler.job_selector = counted
    sys.argv = ["snakemake", "--cores", "2", *(["--max-jobs-per-timespan", args.limit] if args.limit else []),
                args.recipe]
    os.chdir(ROOT)
    started = time.perf_counter()
    try:
        snakemake_main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    wall = time.perf_counter() - started
    own = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{args.recipe} ({'limit ' + args.limit if args.limit else 'no limit'}): exit {code}, wall {wall:.1f} s, "
          f"{passes[0]} scheduling passes ({selecting[0]:.2f} s selecting jobs), Snakemake's process "
          f"{own.ru_utime:.1f} s user + {own.ru_stime:.1f} s system CPU")
    sys.exit(code)


if __name__ == "__main__":
    main()

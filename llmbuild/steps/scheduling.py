"""Snakemake's scheduling loop on one machine, kept to one pass per job event.

Snakemake's command line always sets a job rate limit (`--max-jobs-per-timespan`, default 100 jobs a
second). Under a limit every pass of its scheduling loop ends by arming a timer that wakes the loop again
one timespan later, while a finished job wakes it as well: each finished job starts one more chain of
wake-ups that lasts to the end of the run (upstream: snakemake/snakemake pull request 3744). A 1.5B build's
119 jobs ran 9513-10057 passes, about 100 a second by its end, each statting every ready job's inputs: 21-25 s
of the main process's CPU on 2 cores shared with the jobs; without the limit, 118 passes and 6-9 s
(benchmarks/scheduling_passes.py; docs/performance.md).

On one machine the limit guards nothing (a job starts only when its cores and memory are free), so a
local run drops the command line's default limit before the loop starts. A limit given on the command
line, and a cluster executor's (which protects the cluster's scheduler from bursts of submissions), stay.
"""

from __future__ import annotations

from typing import Any

# `--max-jobs-per-timespan`'s default: 100 jobs per 1 s.
DEFAULT_LIMIT = (100, 1.0)


def drop_default_rate_limit(workflow: Any) -> bool:
    """From the workflow's `onstart` hook (the scheduler exists, the loop has not started): remove the
    default job rate limit of a local run. True when it was removed."""
    scheduler = getattr(workflow, "scheduler", None)
    limiter = getattr(scheduler, "job_rate_limiter", None)
    if limiter is None or not getattr(workflow, "local_exec", False):
        return False
    if (getattr(limiter, "max_jobs", None), float(getattr(limiter, "timespan", 0))) != DEFAULT_LIMIT:
        return False  # the user's own limit
    scheduler.job_rate_limiter = None
    return True

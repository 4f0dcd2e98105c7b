"""When each job of a Snakemake run started and ended, read from the run's own log (what it prints to the
terminal), and how many jobs were in flight at each moment: the zoo page's jobs-in-flight plot and
benchmarks/zoo_scale.py read it.

The log is the one record every executor writes the same way: a job's block opens with `[date]` and
`rule NAME:` (`localrule NAME:` for a job run by Snakemake itself), names its `jobid:` and, where it has
them, its `wildcards:`, `output:` and `log:` paths; `Finished jobid: N` or `Error in rule NAME:` (with its
`jobid:`) after a later `[date]` ends it. On a cluster "in flight" is from submission to the moment
Snakemake saw the job end: queued, running, and waiting for the next status check.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

from llmbuild.steps.snakemake_log import DATE, ERROR, FIELD, FINISHED, JOB_START, SLURM_SUBMITTED


@dataclass
class Job:
    jobid: int
    rule: str
    recipe: str | None
    local: bool
    start: float  # seconds since the run's first job started
    end: float | None = None  # None: still running when the log ends (the run was killed)
    failed: bool = False
    outputs: str = ""  # the block's output and log paths, as printed: where a job without wildcards belongs
    slurm_id: str | None = None  # the SLURM job it was submitted as (a cluster run)

    @classmethod
    def of(cls, record: dict) -> Job:
        """A job as a history record keeps it (`summary`)."""
        return cls(**{k: record.get(k) for k in ("jobid", "rule", "recipe", "local", "start", "end", "failed",
                                                 "slurm_id")})


def read_jobs(log_text: str, recipes: list[str] | tuple[str, ...] = ()) -> list[Job]:
    """The jobs of the log in the order they started. `recipes`: the names a job may belong to; a job's
    recipe is its `recipe` wildcard, else the first name whose build folder (`/<name>/`) its paths name."""
    jobs: dict[int, Job] = {}
    now: float | None = None
    origin: float | None = None
    lines = log_text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if date := DATE.match(line):
            now = _seconds(date.group(1))
            origin = now if origin is None else origin
            continue
        if now is None:
            continue
        start, error, finished = JOB_START.match(line), ERROR.match(line), FINISHED.match(line)
        if (submitted := SLURM_SUBMITTED.match(line)) and int(submitted.group(1)) in jobs:
            jobs[int(submitted.group(1))].slurm_id = submitted.group(2)
        elif finished and int(finished.group(1)) in jobs:
            jobs[int(finished.group(1))].end = now - origin
        elif start or error:
            fields, i = _fields(lines, i)
            if "jobid" not in fields or not fields["jobid"].isdigit():
                continue
            jobid = int(fields["jobid"])
            if start and jobid not in jobs:
                rule, paths = start.group(2), " ".join(fields.get(key, "") for key in ("output", "log"))
                jobs[jobid] = Job(jobid, rule, _recipe_of(rule, fields, paths, recipes), bool(start.group(1)),
                                  now - origin, outputs=paths)
            elif error and jobid in jobs:
                jobs[jobid].end, jobs[jobid].failed = now - origin, True
    return sorted(jobs.values(), key=lambda j: (j.start, j.jobid))


def first_date(log_text: str) -> float | None:
    """When the log's first job started (seconds since the epoch, the machine's local time as printed): what
    the jobs' times count from, to compare them with SLURM's own record."""
    for line in log_text.splitlines():
        if date := DATE.match(line):
            return _seconds(date.group(1))
    return None


def in_flight(jobs: list[Job]) -> list[tuple[float, dict[str, int]]]:
    """(time, jobs in flight per recipe) after every start and end, in time order; a job with no end
    counts until the last event. Jobs of no recipe count under ""."""
    events: list[tuple[float, int, str]] = []
    for job in jobs:
        events.append((job.start, 1, job.recipe or ""))
        if job.end is not None:
            events.append((job.end, -1, job.recipe or ""))
    counts: dict[str, int] = {job.recipe or "": 0 for job in jobs}
    series: list[tuple[float, dict[str, int]]] = []
    for time_s, change, recipe in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts at a tie
        counts[recipe] += change
        if series and series[-1][0] == time_s:
            series[-1] = (time_s, dict(counts))
        else:
            series.append((time_s, dict(counts)))
    return series


def summary(jobs: list[Job]) -> dict:
    """What a history record keeps of a run's schedule: every job's span, the wall time, the most jobs in
    flight at once and the most recipes with a job in flight at once."""
    series = in_flight(jobs)
    ends = [j.end for j in jobs if j.end is not None]
    return {
        "jobs": [{k: v for k, v in asdict(j).items() if k != "outputs"} for j in jobs],
        "wall_seconds": max(ends) if ends else None,
        "max_in_flight": max((sum(c.values()) for _, c in series), default=0),
        "max_recipes_in_flight": max((sum(1 for r, n in c.items() if r and n) for _, c in series), default=0),
    }


def _seconds(printed: str) -> float:
    return datetime.strptime(" ".join(printed.split()), "%a %b %d %H:%M:%S %Y").timestamp()


def _fields(lines: list[str], i: int) -> tuple[dict[str, str], int]:
    """The indented `key: value` lines of a job block from line i; returns them and the line after."""
    fields = {}
    while i < len(lines) and (field := FIELD.match(lines[i])):
        fields.setdefault(field.group(1), field.group(2).strip())
        i += 1
    return fields, i


def _recipe_of(rule: str, fields: dict[str, str], paths: str, recipes: list[str] | tuple[str, ...]) -> str | None:
    wildcards = dict(part.split("=", 1) for part in fields.get("wildcards", "").split(", ") if "=" in part)
    if wildcards.get("recipe"):
        return wildcards["recipe"]
    if rule in recipes:  # a recipe's own target (`snakemake NAME`)
        return rule
    return next((name for name in recipes if f"/{name}/" in paths), None)

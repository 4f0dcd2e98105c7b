"""The lines of Snakemake's own log (what it prints to the terminal, and keeps under `.snakemake/log/`) that
llmbuild reads: `llmbuild compile`'s progress (steps/progress.py) and the zoo's job timeline
(zoo/timeline.py). One place, so the two readers cannot drift apart when Snakemake's wording changes.

A job's block opens with `[date]` and `rule NAME:` (`localrule NAME:` for a job Snakemake runs itself,
`checkpoint NAME:` for a checkpoint rule), then indented fields (`jobid: N`, `wildcards: ...`, `output:
...`, `log: ...`); `Finished jobid: N (Rule: NAME)` or `Error in rule NAME:` after a later `[date]` ends it.
"""

from __future__ import annotations

import re

DATE = re.compile(r"^\[(\w{3} \w{3} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4})\]$")
JOB_START = re.compile(r"^(local)?(?:rule|checkpoint) (\S+):$")  # (local?, rule)
FIELD = re.compile(r"^\s+(\w+): (.*)$")  # (name, value), inside a job's block
JOBID = re.compile(r"^\s+jobid: (\d+)$")
FINISHED = re.compile(r"^Finished jobid: (\d+)(?: \(Rule: (\S+)\))?")  # (jobid, rule where printed)
ERROR = re.compile(r"^Error in rule (\S+):")
STEPS = re.compile(r"^(\d+) of (\d+) steps \(\d+%\) done")
STATS = re.compile(r"^Job stats:")
STATS_ROW = re.compile(r"^(\S+)\s+(\d+)$")
COMPLETE_LOG = re.compile(r"^Complete log\(s\): (\S+)")
SLURM_SUBMITTED = re.compile(r"^Job (\d+) has been submitted with SLURM jobid (\d+)")  # (jobid, SLURM id)
NOTHING_TO_DO = "Nothing to be done"

"""The nightly model zoo (docs/zoo.md): every recipe tried, each outcome recorded, one page with plots,
a history of runs and the regressions since the previous one.

`rules/zoo.smk` wires it: one `llmbuild zoo-build` job builds every recipe in one Snakemake run and records
each outcome (build.py, which never fails), then `llmbuild zoo-page` (report.py) writes the history record,
the schedule read from the run's log (timeline.py) and the pages; `llmbuild zoo-check` (check.py)
is the nightly script's exit status. Nothing here is needed to build or run a model.
"""

"""Wall time and peak memory per rule, from the `benchmark:` files Snakemake writes for every rule
(<build>/<recipe>/benchmarks/<rule>.tsv: seconds, max_rss in MB, cpu_time, ...)."""

from __future__ import annotations

import re
from pathlib import Path

from llmbuild import LlmbuildError

_COLUMNS = {"s": "seconds", "max_rss": "max_rss_mb", "cpu_time": "cpu_seconds"}
# layers_0-1, checks_2-3: one rule per shard of layers; the step is the part before the span.
_SHARD = re.compile(r"_\d+-\d+$")


def read_rules(folder: Path) -> dict[str, dict[str, float | None]]:
    """rule -> {seconds, max_rss_mb, cpu_seconds} for every benchmark file in `folder` (the last repeat
    when Snakemake ran a rule several times); {} when there is none."""
    rules = {}
    for tsv in sorted(Path(folder).glob("*.tsv")):
        rules[tsv.stem] = _read(tsv)
    return rules


def step_of(rule: str) -> str:
    """The step a rule belongs to (`layers_0-1` -> `layers`), to add shards up in the overview."""
    return _SHARD.sub("", rule)


def _read(tsv: Path) -> dict[str, float | None]:
    lines = [line.split("\t") for line in tsv.read_text(encoding="utf-8", errors="replace").splitlines() if line]
    if len(lines) < 2 or any(len(row) != len(lines[0]) for row in lines[1:]):
        raise LlmbuildError(f"{tsv}: expected Snakemake's benchmark table (a header and a row of values)")
    row = dict(zip(lines[0], lines[-1], strict=True))
    return {key: _number(row.get(column)) for column, key in _COLUMNS.items()}


def _number(text: str | None) -> float | None:
    """Snakemake writes `-` or `NA` where a value could not be measured."""
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None

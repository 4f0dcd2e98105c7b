"""Benchmark records: one table of measured figures as plain JSON, with what is needed to trust and rerun it.

A record (`benchmarks/records/<name>.json`) holds the exact command that produced it (paths relative to the
repository), the machine (CPU model, cores, memory), the date, the llmbuild commit, a caption and the
table (columns and rows). `benchmarks/performance_doc.py` writes docs/performance.md from the records, so
the doc shows only what some record holds. Benchmark scripts write records through `write_record`; a
figure measured before records existed is transcribed by hand and says so in `transcribed_from`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "benchmarks" / "records"

# The doc's sections, in the order it shows them; a record names one of these.
SECTIONS = ("real-size builds", "host runtime", "vision-language builds", "numerical agreement",
            "quantized builds", "cost model", "binary loader", "the zoo", "reproducible binaries")

Cell = str | int | float | bool | None


class RecordError(ValueError):
    """A record that cannot be read: the message is one line naming the file and the field."""


@dataclass
class Record:
    name: str
    section: str
    title: str
    caption: str
    command: str
    machine: dict[str, str | int | float]
    date: str  # YYYY-MM-DD (UTC)
    commit: str  # the llmbuild commit the figures were measured at
    columns: list[str]
    rows: list[list[Cell]]
    notes: list[str] = field(default_factory=list)
    order: int = 50  # place within its section (lower first; then by name)
    transcribed_from: str = ""  # set when the figures were copied from an older document, not written by a run


def machine() -> dict[str, str | int | float]:
    """The CPU model, the cores this process may use and the memory, read from /proc (Linux)."""
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                memory_kib = int(line.split()[1])
                break
    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "memory_gib": round(memory_kib / 2**20)}


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    # Records and the doc written from them are this process's output, not a change to what was measured.
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                            ":!benchmarks/records", ":!docs/performance.md"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return out + ("-dirty" if dirty else "")


def command_line(argv: list[str] | None = None) -> str:
    """This process's command as it would be typed at the repository's root: its script and any path
    inside the repository relative to the root, so the record names no machine path."""
    argv = list(sys.argv if argv is None else argv)
    return " ".join(_quoted(w) for w in ["python", *(_relative(word) for word in argv)])


def _relative(word: str) -> str:
    """A path inside the repository, alone or as an option's `--name=value`, made relative to its root."""
    prefix, sep, value = word.partition("=") if word.startswith("--") else ("", "", word)
    path = Path(value)
    if path.is_absolute() and path.resolve().is_relative_to(ROOT):
        value = str(path.resolve().relative_to(ROOT))
    elif not path.is_absolute() and path.exists() and Path.cwd() != ROOT:
        value = str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else value
    return prefix + sep + value


def _quoted(word: str) -> str:
    return word if re.fullmatch(r"[\w./=:,+@%-]+", word) else "'" + word.replace("'", "'\\''") + "'"


def write_record(path: Path, *, name: str, section: str, title: str, caption: str, columns: list[str],
                 rows: list[list[Cell]], notes: list[str] = (), order: int = 50, command: str | None = None,
                 machine_info: dict | None = None, date: str | None = None, commit: str | None = None,
                 transcribed_from: str = "") -> Record:
    """Write one record; the command, machine, date and commit default to this process's."""
    record = Record(name=name, section=section, title=title, caption=caption,
                    command=command if command is not None else command_line(),
                    machine=machine_info if machine_info is not None else machine(),
                    date=date or time.strftime("%Y-%m-%d", time.gmtime()), commit=commit or git_commit(),
                    columns=list(columns), rows=[list(r) for r in rows], notes=list(notes), order=order,
                    transcribed_from=transcribed_from)
    validate(asdict(record), str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(record))
    return record


def dumps(record: Record) -> str:
    """The record as JSON a person can read: one field a line, one table row a line."""
    data = asdict(record)
    rows = data.pop("rows")
    text = json.dumps(data, indent=1, ensure_ascii=False)
    body = ",\n".join("  " + json.dumps(row, ensure_ascii=False) for row in rows)
    return text[:-2] + ',\n "rows": [\n' + body + "\n ]\n}\n"


_TEXT_FIELDS = ("name", "section", "title", "caption", "command", "date", "commit")
_MACHINE_FIELDS = {"cpu": str, "cores": int, "memory_gib": (int, float)}
_ABSOLUTE = re.compile(r"(?<![\w.])/(work|tmp|root|home|usr/local|mnt|opt|scratch)/")


def validate(data: object, where: str) -> Record:
    """A record from its JSON value, or a RecordError naming `where` and the first bad field."""
    def bad(field_name: str, why: str) -> RecordError:
        return RecordError(f"{where}: field '{field_name}': {why}")

    if not isinstance(data, dict):
        raise bad("(top level)", "a record is a JSON object")
    known = set(Record.__dataclass_fields__)
    for key in data:
        if key not in known:
            raise bad(key, f"unknown field (known: {', '.join(sorted(known))})")
    for key in (*_TEXT_FIELDS, "machine", "columns", "rows"):
        if key not in data:
            raise bad(key, "missing")
    for key in _TEXT_FIELDS:
        if not isinstance(data[key], str) or not data[key].strip():
            raise bad(key, "must be a non-empty string")
    if data["section"] not in SECTIONS:
        raise bad("section", f"{data['section']!r} is not one of {', '.join(SECTIONS)}")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", data["date"]):
        raise bad("date", f"{data['date']!r} is not YYYY-MM-DD")
    if _ABSOLUTE.search(data["command"]):
        raise bad("command", "names a machine path; write paths relative to the repository")
    if not isinstance(data["machine"], dict):
        raise bad("machine", "must be an object with cpu, cores and memory_gib")
    for key, kind in _MACHINE_FIELDS.items():
        if not isinstance(data["machine"].get(key), kind):
            raise bad(f"machine.{key}", "missing or of the wrong type")
    columns = data["columns"]
    if not isinstance(columns, list) or not columns or not all(isinstance(c, str) for c in columns):
        raise bad("columns", "must be a non-empty list of strings")
    rows = data["rows"]
    if not isinstance(rows, list) or not rows:
        raise bad("rows", "must be a non-empty list of rows")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(columns):
            raise bad(f"rows[{i}]", f"must be a list of {len(columns)} cells, one per column")
        for j, cell in enumerate(row):
            if cell is not None and not isinstance(cell, str | int | float):
                raise bad(f"rows[{i}][{j}]", "a cell is a string, a number, true/false or null")
    for key in ("notes",):
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
            raise bad(key, "must be a list of strings")
    if not isinstance(data.get("order", 50), int) or isinstance(data.get("order"), bool):
        raise bad("order", "must be an integer")
    if not isinstance(data.get("transcribed_from", ""), str):
        raise bad("transcribed_from", "must be a string")
    return Record(**data)


def load_record(path: Path) -> Record:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: not JSON: {exc}") from None
    record = validate(data, str(path))
    if record.name != path.stem:
        raise RecordError(f"{path}: field 'name': {record.name!r} differs from the file's name {path.stem!r}")
    return record


def load_records(directory: Path = RECORDS) -> list[Record]:
    records = [load_record(p) for p in sorted(directory.glob("*.json"))]
    return sorted(records, key=lambda r: (SECTIONS.index(r.section), r.order, r.name))

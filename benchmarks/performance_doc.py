"""Write docs/performance.md from the benchmark records in benchmarks/records/.

    python benchmarks/performance_doc.py            write the doc
    python benchmarks/performance_doc.py --check    exit 1, naming the first stale section, if the doc differs

The doc holds the current figures only: each table is one record, shown with its command, machine, date
and commit. Older figures live in git history. The output depends on the records alone (sorted by
section, then by file name), so regenerating from the same records gives the same bytes.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from records import RECORDS, ROOT, SECTIONS, Cell, Record, RecordError, load_records  # noqa: E402

DOC = ROOT / "docs" / "performance.md"

INTRO = """\
# Measured performance

<!-- Written by `python benchmarks/performance_doc.py` from benchmarks/records/*.json: edit the records
     (or rerun their benchmarks), not this file. -->

The current figures, one table per benchmark record. Each gives the command that produced it (run at the
repository's root), the machine, the date and the llmbuild commit. The project's machines are small shared
VMs (2 cores, 24 GiB, no accelerator): wall times move by up to a third with the hour, so compare ratios
from one run rather than times from different ones. Speed targets live here and in `benchmarks/`, never in
unit tests. Older figures, and how each was reached, are in git history (`git log -p docs/performance.md`).

**Regenerate** this file with `python benchmarks/performance_doc.py` (`--check` tells whether it is
current; tests/test_performance_doc.py runs the same comparison). **Add a benchmark**: give its script a
`--record benchmarks/records/NAME.json` option that calls `records.write_record` (benchmarks/records.py:
the machine, date and commit are filled in), run it, commit the record and regenerate. A record marked
*transcribed* was copied from an older version of this document, with its original command and date,
because rerunning it costs more than a few minutes; rerunning its command with `--record` replaces it.
"""

SECTION_TEXT = {
    "real-size builds": (
        "Real-size builds",
        "Random-weight checkpoints with the exact configurations and file formats of the published ones "
        "(`python benchmarks/make_checkpoint.py --model all --out models`), built by the shipped recipes through "
        "Snakemake by `benchmarks/scale.py`, beside TPU-MLIR's `llm_convert` (the incumbent, set up by "
        "`benchmarks/incumbent/setup.sh`, see benchmarks/incumbent/README.md) where it applies. How declared "
        "memory is chosen: `llmbuild/steps/resources.py`."),
    "host runtime": (
        "Host runtime against transformers",
        "`llmbuild run` on the host path (docs/runtime.md) against transformers on the same checkpoint."),
    "vision-language builds": (
        "Vision-language builds",
        "InternVL builds (docs/design.md, \"Vision-language models\")."),
    "numerical agreement": (
        "Numerical agreement",
        "What the builds' own checks measured (docs/verification.md says what is compared)."),
    "quantized builds": (
        "Quantized builds",
        "Checkpoints written by the quantization libraries, and the methods' quality on SmolLM2-135M "
        "(docs/design.md, \"Weight-only quantization\")."),
    "cost model": (
        "Cost model",
        "`llmbuild estimate` and the compiled groups' timing (how the model works and is fitted: docs/design.md, "
        "\"The cost model\")."),
    "binary loader": (
        "Fuzzing the binary loader",
        "Corrupted binaries opened, inspected and run (docs/verification.md, \"Bad input\")."),
    "the zoo": (
        "The zoo",
        "The nightly zoo's schedule on one machine and on the local SLURM cluster (`benchmarks/zoo_scale.py`; "
        "docs/zoo.md, \"One schedule\")."),
    "reproducible binaries": (
        "Reproducible binaries",
        "The sha256 of the binaries the shipped recipes build (`benchmarks/binary_digests.py`), and whether each "
        "is the same file an earlier commit built: the check that a refactor changed no byte a user deploys."),
}


def _cell(value: Cell) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value).replace("|", "\\|")


_NUMBER_TEXT = re.compile(r"[+-]?[\d.,]+(x|%)?")


def _numeric(values: list[Cell]) -> bool:
    """A column of numbers, or of ratios and percentages written as text ("1.17x", "+0.2%"), aligns right."""
    present = [v for v in values if v is not None and v != ""]
    return bool(present) and all(
        (isinstance(v, int | float) and not isinstance(v, bool)) or (isinstance(v, str) and _NUMBER_TEXT.fullmatch(v))
        for v in present)


def table(record: Record) -> str:
    aligns = ["---:" if _numeric([row[i] for row in record.rows]) else "---" for i in range(len(record.columns))]
    lines = ["| " + " | ".join(record.columns) + " |", "|" + "|".join(aligns) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in record.rows]
    return "\n".join(lines)


def render_record(record: Record) -> str:
    m = record.machine
    origin = f"; *transcribed* from {record.transcribed_from}" if record.transcribed_from else ""
    parts = [
        f"### {record.title}",
        record.caption,
        f"```sh\n{record.command}\n```",
        f"Measured {record.date} at llmbuild {record.commit}; machine: {m['cpu']}, {m['cores']} cores, "
        f"{m['memory_gib']} GiB{origin}. Record: `benchmarks/records/{record.name}.json`.",
        table(record),
    ]
    if record.notes:
        parts.append("\n".join(f"- {note}" for note in record.notes))
    return "\n\n".join(parts)


def render(records: list[Record]) -> str:
    parts = [INTRO.rstrip("\n")]
    for section in SECTIONS:
        chosen = [r for r in records if r.section == section]
        if not chosen:
            continue
        heading, text = SECTION_TEXT[section]
        parts.append(f"## {heading}\n\n{text}")
        parts += [render_record(r) for r in chosen]
    return "\n\n".join(parts) + "\n"


def first_stale_section(expected: str, actual: str) -> str:
    """The heading of the first section where the two texts part ("the start" if before any heading)."""
    heading = "the start"
    for want, have in zip(expected.splitlines(), actual.splitlines(), strict=False):
        if want != have:
            return heading
        if want.startswith("#"):
            heading = want.lstrip("# ")
    return heading


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed doc instead of writing it")
    ap.add_argument("--records", type=Path, default=RECORDS)
    ap.add_argument("--doc", type=Path, default=DOC)
    args = ap.parse_args()
    try:
        text = render(load_records(args.records))
    except RecordError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        actual = args.doc.read_text() if args.doc.exists() else ""
        if actual != text:
            print(f"{args.doc.name} is stale from section '{first_stale_section(text, actual)}': "
                  "run python benchmarks/performance_doc.py", file=sys.stderr)
            return 1
        return 0
    args.doc.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

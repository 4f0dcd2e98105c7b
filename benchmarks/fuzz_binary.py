"""The long fuzz run of the binary loader: random raw and re-signed corruptions of a built binary, and edits
of one field of its JSON sections (`meta`, `plan`: a wrong type, an out-of-range value, a value aliased from
another field, a field dropped or two swapped, the binary then re-written and signed), each opened,
described (`llmbuild inspect`) and run for two tokens on the host path; counts of the outcomes.

    python benchmarks/fuzz_binary.py [--cases 100000] [--recipe qwen2_tiny_f32] [--seed 0] [--jobs 2]

Outcomes: ok (the change hit padding, or a re-signed change the model still runs), LlmbuildError (one
line naming the file and the section), hang (no result in --timeout seconds), and any other exception
(a defect: the first few are printed with their mutation). The mutations are those of
tests/binary_mutations.py, which the CI fuzz test (tests/test_binary_fuzz.py) uses with a small budget.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from binary_mutations import (  # noqa: E402
    JSON_EDITS,
    JSON_SECTIONS,
    RAW_KINDS,
    describe_failure,
    json_mutation,
    load_and_run,
    raw_mutation,
    resigned_mutation,
    sections,
)

_STATE: dict = {}


class Hang(Exception):
    pass


def _alarm(signum, frame) -> None:
    raise Hang()


def _init(binary: bytes, timeout: float) -> None:
    _STATE["binary"], _STATE["timeout"] = binary, timeout
    _STATE["names"] = [name for name, _, _ in sections(binary) if name != "weights"]
    _STATE["dir"] = Path(tempfile.mkdtemp(prefix="fuzz_binary_"))
    signal.signal(signal.SIGALRM, _alarm)


def _case(seed: int) -> tuple[str, str, str]:
    rng = random.Random(seed)
    binary = _STATE["binary"]
    draw = rng.random()
    if draw < 0.4:
        kind = rng.choice(RAW_KINDS)
        args = (kind, rng.randrange(1 << 40), rng.randrange(256), rng.randint(1, 64))
        mutated, what = raw_mutation(binary, *args), f"raw {args}"
    elif draw < 0.7:
        jargs = (rng.choice(JSON_SECTIONS), rng.choice(JSON_EDITS), rng.randrange(1 << 30), rng.randrange(1 << 30),
                 rng.randrange(256))
        mutated, what = json_mutation(binary, *jargs), f"json-field {jargs}"
    else:
        section = rng.choice(_STATE["names"])
        args = (section, rng.randrange(1 << 40), rng.randrange(256), rng.randint(0, 16))
        mutated, what = resigned_mutation(binary, *args), f"re-signed {args}"
    path = _STATE["dir"] / f"{os.getpid()}.llmb"
    path.write_bytes(mutated)
    signal.setitimer(signal.ITIMER_REAL, _STATE["timeout"])
    try:
        return what.split()[0], load_and_run(path), ""
    except Hang:
        return what.split()[0], "hang", what
    except BaseException as exc:  # noqa: BLE001 - what the fuzz looks for
        return what.split()[0], "defect", f"{what}: {describe_failure(exc)}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--recipe", default="qwen2_tiny_f32")
    ap.add_argument("--build-dir", type=Path, default=Path(os.environ.get("LLMBUILD_BUILD_DIR", ROOT / "build")))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--record", type=Path, help="also write the table as a benchmark record (benchmarks/records.py)")
    args = ap.parse_args()
    path = args.build_dir / args.recipe / f"{args.recipe}.llmb"
    if not path.is_file():
        sys.exit(f"{path}: build it first (snakemake --cores 2 {args.recipe})")
    binary = path.read_bytes()
    counts: collections.Counter = collections.Counter()
    defects: list[str] = []
    start = time.perf_counter()
    seeds = range(args.seed * args.cases, (args.seed + 1) * args.cases)
    with multiprocessing.Pool(args.jobs, _init, (binary, args.timeout)) as pool:
        for kind, outcome, detail in pool.imap_unordered(_case, seeds, chunksize=64):
            counts[kind, outcome] += 1
            if detail and len(defects) < 20:
                defects.append(detail)
    seconds = time.perf_counter() - start
    print(f"{args.cases} cases on {path.name} ({len(binary)} bytes), {args.jobs} processes, {seconds:.0f} s")
    print("| mutation | ok | LlmbuildError | hang | other exception |")
    print("|---|---:|---:|---:|---:|")
    for kind in ("raw", "re-signed", "json-field"):
        row = [counts[kind, o] for o in ("ok", "LlmbuildError", "hang", "defect")]
        print(f"| {kind} | " + " | ".join(str(n) for n in row) + " |")
    for d in defects:
        print("  " + d)
    if args.record:
        from records import write_record

        write_record(args.record, name=args.record.stem, section="binary loader",
                     title=f"{args.cases:,} corruptions of `{path.name}`",
                     caption=f"Each case corrupts the {len(binary):,}-byte binary (raw: bit flips, truncations, byte "
                     "runs, header and section-table edits; re-signed: a section other than the weights overwritten, "
                     "then its SHA-256 and the header checksum recomputed; json-field: one field of `meta` or `plan` "
                     "given a wrong value, then re-signed), then opens, inspects and runs it for two tokens on the "
                     "host path. "
                     f"A {args.timeout:g} s alarm counts hangs; {args.jobs} processes, {seconds:.0f} s.",
                     columns=["mutation", "ok", "LlmbuildError", "hang", "other exception"],
                     rows=[[kind, *(counts[kind, o] for o in ("ok", "LlmbuildError", "hang", "defect"))]
                           for kind in ("raw", "re-signed", "json-field")], notes=defects)
    if sum(n for (_, outcome), n in counts.items() if outcome in ("defect", "hang")):
        sys.exit(1)


if __name__ == "__main__":
    main()

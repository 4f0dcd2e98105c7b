"""The sha256 of every deployable binary the shipped recipes build, as a table: the check that a refactor
changed no byte of what a user deploys.

    python benchmarks/binary_digests.py [--build-dir DIR] [--recipes NAME ...] [--json FILE]
                                        [--compare FILE [--compare-build DIR]]

It builds the binaries only (each recipe's `.llmb` and, where the recipe makes one, its `.bmodel`; no
verification), with Snakemake as a user would. Recipes whose checkpoint is not on this machine are listed
as such, not built. `--compare` reads a table written earlier by `--json` (e.g. at the commit before a
refactor) and exits 1 naming every binary whose digest differs; with `--compare-build` (the build folder that
table was made from), a `.bmodel` that differs only in the 3 bytes the vendor's code generator leaves unset
in `lm_head` (they differ between two runs of the vendor's own converter: docs/bmodel.md) counts as equal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def buildable(names: list[str]) -> tuple[list[str], dict[str, str]]:
    """The recipes whose checkpoint is here, and the others with the loader's one-line reason."""
    from llmbuild.steps.dag import recipe_problems

    missing, broken = recipe_problems(names)
    if broken:
        raise SystemExit("recipes that do not load: " + "; ".join(f"{k}: {v}" for k, v in broken.items()))
    return [n for n in names if n not in missing], missing


def binary_targets(build_dir: Path, name: str) -> list[Path]:
    from llmbuild.steps.dag import builds_bmodel

    targets = [build_dir / name / f"{name}.llmb"]
    if builds_bmodel(name):
        targets.append(build_dir / name / f"{name}.bmodel")
    return targets


def same_but_unset(path: Path, compare_build: Path | None, name: str, binary: str) -> bool:
    """Whether a `.bmodel` differs from the earlier build's only in lm_head's unset bytes."""
    from llmbuild.bmodel.bmodel_file import differing_offsets, only_unset_bytes

    earlier = compare_build / name / binary if compare_build else None
    if earlier is None or not binary.endswith(".bmodel") or not earlier.exists():
        return False
    differing = differing_offsets(path, earlier)
    if differing is None or not only_unset_bytes(differing):
        return False
    print(f"{name}/{binary}: equal but for the vendor's unset bytes at {differing}", file=sys.stderr)
    return True


def main() -> int:
    from llmbuild.recipe import list_recipes

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build" / "digests")
    ap.add_argument("--recipes", nargs="*", help="default: every buildable shipped recipe")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write the table here")
    ap.add_argument("--compare", type=Path, help="a table written by --json to compare with")
    ap.add_argument("--compare-build", type=Path, help="the build folder the --compare table was made from")
    args = ap.parse_args()

    os.environ["LLMBUILD_BUILD_DIR"] = str(args.build_dir.resolve())
    names, missing = buildable(args.recipes or list_recipes(buildable_only=True))
    rows: dict[str, dict[str, str]] = {}
    for name in names:
        targets = binary_targets(args.build_dir.resolve(), name)
        started = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(args.cores), *map(str, targets)],
                             cwd=ROOT, capture_output=True, text=True)
        if run.returncode:
            sys.stderr.write(run.stderr[-3000:])
            raise SystemExit(f"{name}: the build failed (snakemake exit {run.returncode})")
        rows[name] = {t.name: sha256(t) for t in targets}
        print(f"{name}: built in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    print("| recipe | binary | sha256 |\n|---|---|---|")
    for name, binaries in rows.items():
        for binary, digest in binaries.items():
            print(f"| {name} | {binary} | `{digest}` |")
    for name in missing:
        print(f"| {name} | (checkpoint not here) | |")
    if args.json:
        args.json.write_text(json.dumps({"binaries": rows, "not_here": sorted(missing)}, indent=2) + "\n")
    if args.compare:
        before = json.loads(args.compare.read_text())["binaries"]
        differ = [f"{name}/{binary}" for name, binaries in rows.items() for binary, digest in binaries.items()
                  if name in before and before[name].get(binary) not in (None, digest)
                  and not same_but_unset(args.build_dir.resolve() / name / binary, args.compare_build, name, binary)]
        if differ:
            print(f"differ from {args.compare.name}: {', '.join(differ)}", file=sys.stderr)
            return 1
        print(f"every binary also in {args.compare.name} is byte-identical", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

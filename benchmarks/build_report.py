"""Print where a recipe's build spent its time and memory, from Snakemake's per-job benchmark files.

    python benchmarks/build_report.py smollm2_135m_bf16 [--build-dir build]

Each rule writes build/<recipe>/benchmarks/<job>.tsv (wall seconds, max RSS); run the build from clean
first (`rm -rf build/<recipe> && snakemake --cores 2 <recipe>`).
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("recipe")
    ap.add_argument("--build-dir", default="build")
    args = ap.parse_args()
    folder = Path(args.build_dir) / args.recipe / "benchmarks"
    rows: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for tsv in sorted(folder.glob("*.tsv")):
        step = tsv.stem.split("_")[0] if tsv.stem.startswith(("layer_", "layers_")) else tsv.stem
        with tsv.open() as f:
            for rec in csv.DictReader(f, delimiter="\t"):
                rss = float(rec["max_rss"]) if rec["max_rss"] not in ("-", "NA", "") else 0.0
                rows[step].append((float(rec["s"]), rss))
    if not rows:
        raise SystemExit(f"no benchmark files in {folder}: build the recipe first")
    print(f"{'step':<10} {'jobs':>4} {'total s':>8} {'max s':>7} {'max RSS MiB':>12}")
    total = 0.0
    for step, vals in rows.items():
        secs = [s for s, _ in vals]
        total += sum(secs)
        print(f"{step:<10} {len(vals):>4} {sum(secs):>8.1f} {max(secs):>7.1f} {max(r for _, r in vals):>12.0f}")
    print(f"{'all jobs':<10} {sum(len(v) for v in rows.values()):>4} {total:>8.1f}  (each job's wall time, summed; "
          "the build's own wall time is lower where jobs ran side by side)")


if __name__ == "__main__":
    main()

"""Print the verification margins finished builds reach, per recipe and per activation dtype.

    python benchmarks/margins.py build [more build folders ...]

Each argument is a build folder (one sub-folder per recipe, as `snakemake` writes them). For every recipe
whose checks and end-to-end run finished (e2e.json, whether verify passed or not) the table shows the
worst similarity of each kind the verify step compares: TOP against transformers (outputs), TPU against
TOP (every op and every output), and the end-to-end logits of every teacher-forced step against
transformers in f32; beside each, the share of the recipe's error budget (llmbuild/recipe/tolerances.py)
its relative error uses. docs/verification.md shows the run behind the default tolerances.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from llmbuild.recipe.tolerances import KINDS, default_tolerances, relative_error


def _recipe(build: Path):
    from llmbuild import LlmbuildError
    from llmbuild.recipe import load_recipe

    candidate = build / f"{build.name}.yaml"  # `llmbuild compile` writes the recipe beside the build
    try:
        return load_recipe(candidate if candidate.is_file() else build.name, require_checkpoint=False,
                           check_fit=False)
    except LlmbuildError:
        return None


def margins(build: Path) -> dict[str, float]:
    """The worst similarity of each kind over every layer, stage, op and output of one build."""
    worst = dict.fromkeys(KINDS, 1.0)

    def take(kind: str, value: float) -> None:
        worst[kind] = min(worst[kind], value) if not math.isnan(value) else -1.0

    files = [build / "head" / "metrics.json", *sorted((build / "layers").glob("*/metrics.json"))]
    for path in files:
        for entry in json.loads(path.read_text())["stages"].values():
            for s in entry["top_vs_source"].values():
                take("top_cosine", s["cosine"])
                take("top_euclid", s["euclid"])
            for s in entry["tpu_vs_top"]["outputs"].values():
                take("tpu_cosine", s["cosine"])
                take("tpu_euclid", s["euclid"])
            for _, cosine, euclid in entry["tpu_vs_top"]["ops"]:
                take("tpu_cosine", cosine)
                take("tpu_euclid", euclid)
    e2e = json.loads((build / "e2e.json").read_text())
    for step in e2e.get("step_logits") or [e2e["first_logits"]]:  # every teacher-forced step
        take("logits_cosine", step["cosine"])
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("builds", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, help="also write the rows (recipe, mode, layers, worst per kind) here")
    ap.add_argument("--record", type=Path, help="also write the table as a benchmark record (benchmarks/records.py)")
    args = ap.parse_args()
    rows: list[dict] = []
    for root in args.builds:
        # Every build whose checks and end-to-end run finished, whether or not its tolerances then passed:
        # the margins are measured against the budget, not selected by it.
        for e2e in sorted(root.glob("*/e2e.json")):
            build = e2e.parent
            recipe = _recipe(build)
            if recipe is not None and (build / "head" / "metrics.json").is_file():
                layers = json.loads((build / "spec.json").read_text())["num_layers"]
                rows.append({"recipe": build.name, "mode": recipe.quantization.mode, "num_layers": layers,
                             "worst": margins(build), "tolerances": {k: getattr(recipe.verify, k) for k in KINDS}})
    if not rows:
        raise SystemExit("no finished builds (e2e.json) under " + " ".join(map(str, args.builds)))
    print("Worst similarity per kind, and the share of the recipe's budget its relative error uses (over 1.00: "
          "fails; a tenfold error fails where the share is over 0.10):")
    print(f"{'recipe':<28} {'mode':<7} {'L':>3} " + " ".join(f"{k:>22}" for k in KINDS))
    for row in rows:
        cells = []
        for k in KINDS:
            used = relative_error(k, row["worst"][k]) / relative_error(k, row["tolerances"][k])
            cells.append(f"{row['worst'][k]:>13.7f} {used:>7.2f}x" + ("*" if row["tolerances"][k] != _default(row, k)
                                                                       else " "))
        print(f"{row['recipe']:<28} {row['mode']:<7} {row['num_layers']:>3} " + " ".join(cells))
    print("(* not the depth's budget: a random-weight fixture's logits (under 2e7 parameters), or the recipe's own)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.record:
        write_margins_record(args.record, rows)


def write_margins_record(path: Path, rows: list[dict]) -> None:
    from records import write_record

    table = []
    for row in rows:
        cells = []
        for k in KINDS:
            used = relative_error(k, row["worst"][k]) / relative_error(k, row["tolerances"][k])
            own = "" if row["tolerances"][k] == _default(row, k) else " *"
            cells += [round(row["worst"][k], 7), f"{used:.2f}x{own}"]
        table.append([row["recipe"], row["mode"], row["num_layers"], *cells])
    columns = ["recipe", "mode", "layers"]
    for k in KINDS:
        columns += [f"{k}: worst", f"{k}: budget used"]
    write_record(path, name=path.stem, section="numerical agreement", title="Verification margins of finished builds",
                 caption="The worst similarity of each kind the verify step compares, and the share of the recipe's "
                 "error budget (`llmbuild/recipe/tolerances.py`) its relative error uses: over 1.00x fails. `*`: "
                 "not the depth's default budget (a random-weight fixture's logits, or the recipe's own).",
                 columns=columns, rows=table)


def _default(row: dict, kind: str) -> float:
    return default_tolerances(row["mode"], row["num_layers"])[kind]


if __name__ == "__main__":
    main()

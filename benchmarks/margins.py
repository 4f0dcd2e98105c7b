"""Print the verification margins finished builds reach, per recipe and per activation dtype.

    python benchmarks/margins.py build [more build folders ...]

Each argument is a build folder (one sub-folder per recipe, as `snakemake` writes them). For every recipe
whose checks and end-to-end run finished (e2e.json, whether verify passed or not) the table shows the
worst similarity of each kind the verify step compares: TOP against transformers (outputs), TPU against
TOP (every op and every output), and the end-to-end logits of every teacher-forced step against
transformers in f32. The last table takes the worst over the recipes of one
activation dtype, the key of the per-mode default tolerances (llmbuild/recipe/tolerances.py); docs/
verification.md shows how the defaults were chosen from it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from llmbuild.recipe.tolerances import DEFAULTS, KINDS, activation_dtype, derive


def _mode(build: Path) -> str | None:
    from llmbuild import LlmbuildError
    from llmbuild.recipe import load_recipe

    for candidate in (build / f"{build.name}.yaml",):  # `llmbuild compile` writes the recipe beside the build
        if candidate.is_file():
            return load_recipe(candidate, require_checkpoint=False).quantization.mode
    try:
        return load_recipe(build.name, require_checkpoint=False).quantization.mode
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
    args = ap.parse_args()
    rows: list[tuple[str, str, dict[str, float]]] = []
    for root in args.builds:
        # Every build whose checks and end-to-end run finished, whether or not its tolerances then passed:
        # the margins are what the tolerances are derived from, not the other way round.
        for e2e in sorted(root.glob("*/e2e.json")):
            build = e2e.parent
            mode = _mode(build)
            if mode is not None and (build / "head" / "metrics.json").is_file():
                rows.append((build.name, mode, margins(build)))
    if not rows:
        raise SystemExit("no finished builds (e2e.json) under " + " ".join(map(str, args.builds)))
    head = f"{'recipe':<28} {'mode':<7} " + " ".join(f"{k:>13}" for k in KINDS)
    print(head)
    for name, mode, worst in rows:
        print(f"{name:<28} {mode:<7} " + " ".join(f"{worst[k]:>13.7f}" for k in KINDS))
    print()
    print(f"{'activations':<12} {'builds':>6} " + " ".join(f"{k:>13}" for k in KINDS))
    for dtype in ("f32", "f16", "bf16"):
        group = [w for _, mode, w in rows if activation_dtype(mode) == dtype]
        if group:
            worst = {k: min(w[k] for w in group) for k in KINDS}
            print(f"{dtype:<12} {len(group):>6} " + " ".join(f"{worst[k]:>13.7f}" for k in KINDS))
            print(f"{'  derived':<12} {'':>6} " + " ".join(f"{derive(k, worst[k]):>13.7f}" for k in KINDS))
            print(f"{'  shipped':<12} {'':>6} " + " ".join(f"{DEFAULTS[dtype][k]:>13.7f}" for k in KINDS))


if __name__ == "__main__":
    main()

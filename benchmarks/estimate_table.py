"""Print the cost model's tables (docs/design.md, "The cost model", says how the model works):

    python benchmarks/estimate_table.py                 every recipe whose model shape is readable
    python benchmarks/estimate_table.py --calibration   the fit, its errors and the roofline fractions
    python benchmarks/estimate_table.py --sensitivity   the fit redone for 2..6 attention-score passes
    python benchmarks/estimate_table.py --ablation      from the incumbent's schedule to ours, step by step

Any of them with `--record benchmarks/records/NAME.json` also writes the table as a benchmark record
(benchmarks/records.py), from which docs/performance.md is written.

Recipes are loaded without their checkpoints (`require_checkpoint=False`), as `llmbuild estimate` does.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmbuild import LlmbuildError  # noqa: E402
from llmbuild.cost import INCUMBENT, LLMBUILD, estimate_recipe  # noqa: E402
from llmbuild.cost.efficiency import CALIBRATED  # noqa: E402
from llmbuild.cost.estimate_text import markdown_table  # noqa: E402
from llmbuild.cost.fit_efficiency import calibration_rows, fit  # noqa: E402
from llmbuild.frontend.config_spec import spec_without_weights  # noqa: E402
from llmbuild.recipe import list_recipes, load_recipe  # noqa: E402

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def recipe_table() -> tuple[list[str], list[list]]:
    rows = []
    for name in list_recipes(RECIPES):
        try:
            recipe = load_recipe(name, RECIPES, require_checkpoint=False)
            spec = spec_without_weights(recipe.source)
        except LlmbuildError as exc:
            print(f"# skipped {name}: {exc}", file=sys.stderr)
            continue
        inc = estimate_recipe(recipe, spec, schedule=INCUMBENT)
        ours = estimate_recipe(recipe, spec, schedule=LLMBUILD)
        params = f"{inc.params / 1e9:.2f} B" if inc.params >= 1e9 else f"{inc.params / 1e6:.1f} M"
        memory = inc.device_memory_bytes
        rows.append([
            name, params, inc.mode, inc.chip, inc.seq_length, inc.prefill_length,
            f"{inc.first_token_latency_s:.4g}", f"{inc.decode_tokens_per_s:.4g}", f"{inc.decode_roofline_fraction:.1%}",
            f"{ours.first_token_latency_s:.4g}", f"{ours.decode_tokens_per_s:.4g}",
            f"{ours.decode_roofline_fraction:.1%}", f"{memory / 2**30:.2f} GiB" if memory >= 2**30 else
            f"{memory / 2**20:.1f} MiB", str(inc.fits).lower(),
        ])
    headers = ["recipe", "params", "mode", "chip", "S", "L", "FTL s (incumbent)", "tok/s (incumbent)",
               "roofline (incumbent)", "FTL s (llmbuild)", "tok/s (llmbuild)", "roofline (llmbuild)",
               "device memory", "fits"]
    return headers, rows


def calibration_notes() -> list[str]:
    stored, fitted = CALIBRATED["bm1684x"], fit()
    return [f"fit(): ddr {fitted.ddr:.4f}, mac {fitted.mac:.4f}, launch {fitted.launch_s * 1e3:.4f} ms",
            f"stored (`cost/efficiency.py`): ddr {stored.ddr}, mac {stored.mac}, launch {stored.launch_s * 1e3:.3f} ms"]


def calibration_table() -> tuple[list[str], list[list]]:
    rows = [[
        r["recipe"], r["seq_length"], r["published_ftl_s"], f"{r['model_ftl_s']:.3f}", f"{r['ftl_error']:+.1%}",
        r["published_tokens_per_s"], f"{r['model_tokens_per_s']:.3f}", f"{r['tokens_per_s_error']:+.1%}",
        f"{r['published_roofline_fraction']:.1%}", f"{r['ours_ftl_s']:.3f}", f"{r['ours_tokens_per_s']:.2f}",
        f"{r['ours_roofline_fraction']:.1%}", f"{r['ours_sustained_fraction']:.1%}",
    ] for r in calibration_rows()]
    headers = ["point", "S = L", "FTL published s", "FTL model s", "FTL error", "tok/s published", "tok/s model",
               "tok/s error", "roofline, published", "ours: FTL s", "ours: tok/s", "ours: roofline",
               "ours: of sustained"]
    return headers, rows


def sensitivity_table() -> tuple[list[str], list[list]]:
    """The fit under other assumptions about the incumbent's prefill attention: scores written to DDR and
    read back 2..6 times in all, or kept in local memory (flash attention)."""
    variants = [(f"{k} passes", replace(INCUMBENT, score_passes=k)) for k in (2, 3, 4, 5, 6)]
    variants.append(("flash attention", replace(INCUMBENT, flash_attention=True)))
    rows = []
    for label, schedule in variants:
        eff = fit(schedule=schedule)
        errors = [f"{r['ftl_error']:+.1%}" for r in calibration_rows(eff, schedule)]
        rows.append([label, f"{eff.ddr:.3f}", f"{eff.mac:.3f}", f"{eff.launch_s * 1e3:.3f}", *errors])
    headers = ["incumbent's attention scores", "ddr", "mac", "launch ms", "FTL error 1.5B (S 8192)",
               "FTL error 14B (S 512)"]
    return headers, rows


def ablation_table() -> tuple[list[str], list[list]]:
    """From the incumbent's schedule to ours one change at a time, at both published points."""
    from llmbuild.cost.fit_efficiency import PUBLISHED, model_point

    steps = [("incumbent (calibrated)", INCUMBENT)]
    steps.append(("+ weight prefetch across ops", replace(steps[-1][1], prefetch_across_ops=True)))
    steps.append(("+ one launch per step (prefetch crosses layers)", replace(steps[-1][1], launch_per_net=False)))
    steps.append(("+ flash attention", replace(steps[-1][1], flash_attention=True)))
    steps.append(("+ w4 lm_head (= llmbuild)", replace(steps[-1][1], quantize_lm_head=True)))
    rows = []
    for label, schedule in steps:
        row = [label]
        for point in PUBLISHED:
            e = model_point(point, schedule=schedule)
            row += [f"{e.first_token_latency_s:.3f}", f"{e.decode_tokens_per_s:.2f}",
                    f"{e.decode_bytes_per_token / 1e9:.3f}", f"{e.decode_roofline_fraction:.1%}"]
        rows.append(row)
    headers = ["schedule", "1.5B FTL s", "1.5B tok/s", "1.5B GB/token", "1.5B roofline",
               "14B FTL s", "14B tok/s", "14B GB/token", "14B roofline"]
    return headers, rows


TABLES = {
    "recipes": (recipe_table, 10, "Every recipe, estimated",
                "`llmbuild estimate` on every recipe whose model shape is readable, under both schedules. The tiny "
                "models are all launch overhead: their fractions mean nothing. Each recipe is estimated with its own "
                "`quantization.lm_head`."),
    "calibration": (calibration_table, 20, "The fit: the two published points",
                    "The three efficiencies fitted on the BM1684X's two published points (SE7-32, w4bf16, g 64, a "
                    "static prefill of the whole window); the decode speeds are reproduced by construction, one FTL "
                    "is a genuine check. The roofline is 64 GiB/s over the bytes one decode step reads."),
    "sensitivity": (sensitivity_table, 30, "The fit under other assumptions about the incumbent's attention",
                    "The fit redone with the incumbent's prefill attention scores written to DDR and read back 2-6 "
                    "times in all, or kept in local memory (flash attention)."),
    "ablation": (ablation_table, 40, "From the incumbent's schedule to ours, one change at a time",
                 "Both published points under each schedule, with the same chip efficiencies."),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", action="store_true")
    parser.add_argument("--sensitivity", action="store_true")
    parser.add_argument("--ablation", action="store_true")
    parser.add_argument("--record", type=Path, help="also write the table as a benchmark record here")
    args = parser.parse_args()
    kind = next((k for k in ("calibration", "ablation", "sensitivity") if getattr(args, k)), "recipes")
    make, order, title, caption = TABLES[kind]
    headers, rows = make()
    notes = calibration_notes() if kind == "calibration" else []
    print("\n".join(notes + [""]) + markdown_table(headers, rows) if notes else markdown_table(headers, rows))
    if args.record:
        from records import write_record

        write_record(args.record, name=args.record.stem, section="cost model", title=title, caption=caption,
                     columns=headers, rows=rows, notes=notes, order=order)


if __name__ == "__main__":
    main()

"""`llmbuild estimate RECIPE [--json]` and `llmbuild estimate --config config.json --quantize MODE --chip CHIP
--seq-length N [--prefill-length L]`: the cost model's estimate from a recipe or a bare config, no weights.

Wired into `llmbuild.cli` as the `estimate` verb (a parser without the positional recipe the other verbs
take: `add_estimate_arguments` adds an optional one).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from llmbuild import LlmbuildError


def add_estimate_arguments(parser: argparse.ArgumentParser) -> None:
    # No imports here: this runs whenever the CLI builds its parser, for every verb. Values are checked
    # by estimate_command, with the lists of what is known.
    parser.add_argument("recipe", nargs="?", help="recipe name (recipes/NAME.yaml) or path; or give --config")
    parser.add_argument("--config", type=Path, help="a Hugging Face config.json, instead of a recipe")
    parser.add_argument("--quantize", metavar="MODE",
                        help="f32, bf16, f16, w4bf16, w4f16, w8bf16 or w8f16 (default: the recipe's, or bf16)")
    parser.add_argument("--group-size", type=int,
                        help="w4/w8 group size (default: the recipe's, or 64; -1: per channel)")
    parser.add_argument("--chip", help="a chip in llmbuild/chips/data/ (default: the recipe's, or bm1684x)")
    parser.add_argument("--seq-length", type=int, help="S, KV-cache capacity (required with --config)")
    parser.add_argument("--prefill-length", type=int, help="L, tokens per prefill call (default with --config: S)")
    parser.add_argument("--position", type=int, help="decode position (default: S)")
    parser.add_argument("--device-memory-bytes", type=int, help="device memory limit (default: the recipe's or chip's)")
    parser.add_argument("--schedule", default="incumbent",
                        help="incumbent (default: TPU-MLIR's, calibrated on published figures) or llmbuild "
                             "(our compiler's schedule, projected with the same efficiencies)")
    parser.add_argument("--ops", action="store_true", help="list every op in the text report")
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")


def estimate_command(args: argparse.Namespace) -> None:
    from llmbuild.cost.chip_estimate import estimate
    from llmbuild.cost.estimate_text import text_report
    from llmbuild.cost.schedule import SCHEDULES
    from llmbuild.frontend.config_spec import spec_from_hf_config_file, spec_without_weights
    from llmbuild.recipe import load_recipe
    from llmbuild.recipe_types import DEFAULT_GROUP_SIZE

    if (args.recipe is None) == (args.config is None):
        raise LlmbuildError("estimate: give a RECIPE or --config PATH/config.json (one of them)")
    if args.schedule not in SCHEDULES:
        raise LlmbuildError(f"estimate: --schedule {args.schedule!r}: expected one of {', '.join(SCHEDULES)}")
    if args.recipe is not None:
        recipe = load_recipe(args.recipe, require_checkpoint=False, check_fit=False)
        spec = spec_without_weights(recipe.source)
        title, source = recipe.name, str(recipe.path)
        mode = args.quantize or recipe.quantization.mode
        group = args.group_size if args.group_size is not None else recipe.quantization.group_size
        chip = args.chip or recipe.target.chip
        seq = args.seq_length or recipe.stages.seq_length
        prefill = args.prefill_length or min(recipe.stages.prefill_length, seq)
        limit = args.device_memory_bytes or recipe.target.device_memory_bytes
        # The recipe's lm_head as it builds it (estimate_recipe's), unless another mode is asked for.
        lm_head = recipe.quantization.lm_head if args.quantize is None else "schedule"
    else:
        if args.seq_length is None:
            raise LlmbuildError("estimate: --config needs --seq-length")
        spec = spec_from_hf_config_file(args.config)
        title, source = str(args.config), str(args.config)
        mode, chip = args.quantize or "bf16", args.chip or "bm1684x"
        group = args.group_size if args.group_size is not None else DEFAULT_GROUP_SIZE
        seq = args.seq_length
        prefill = args.prefill_length or seq
        limit = args.device_memory_bytes
        lm_head = "schedule"
    # The chosen schedule in full, and every schedule's headline numbers beside it.
    others = {name: estimate(spec, mode, group, chip, seq, prefill, args.position, schedule=name,
                             device_memory_bytes=limit, lm_head=lm_head) for name in SCHEDULES}
    est = others[args.schedule]
    vision = _vision(recipe if args.recipe is not None else None, mode, chip)
    if args.json:
        headlines = {name: e.headline() for name, e in others.items()}
        extra = {"vision": vision} if vision else {}
        print(json.dumps({"name": title, "source": source, **est.to_dict(), **extra, "schedules": headlines},
                         indent=1))
    else:
        print(text_report(est, title, others=[e for name, e in others.items() if name != args.schedule],
                          ops=args.ops))
        if vision and "vision_encode_image_s" in vision:  # MiniCPM-V: slices
            print(f"vision: {vision['vision_encode_s'] * 1e3:.2f} ms per slice of up to "
                  f"{vision['vision_patches_per_slice']:.0f} patches ({vision['vision_tokens_per_tile']:.0f} image "
                  f"tokens), {vision['vision_encode_image_s'] * 1e3:.1f} ms for an image of "
                  f"{vision['vision_pieces_per_image']:.0f} pieces, before the first token")
        elif vision:
            print(f"vision: {vision['vision_encode_s'] * 1e3:.2f} ms per {vision['image_size']} px tile "
                  f"({vision['vision_tokens_per_tile']:.0f} image tokens), before the first token")


def _hf_config(recipe) -> dict | None:
    """A vision-language recipe's config.json: a synthetic one as prepare writes it (the family folder's
    `synthetic.vlm_config`); an hf checkpoint's own, else the one shipped with the recipe (no weights needed)."""
    from llmbuild.families.registry import family_part
    from llmbuild.frontend.hf import read_json

    if recipe.source.kind == "synthetic" and recipe.vision.config is not None:  # as prepare writes it
        from llmbuild.frontend.synthetic import full_hf_config

        vlm_config = family_part(recipe.vision.family, "synthetic").vlm_config
        return vlm_config(full_hf_config(recipe.source.config or {}), recipe.vision.config)
    if recipe.source.kind != "hf":
        return None
    folder = Path(recipe.source.path) if recipe.source.path else None
    path = folder / "config.json" if folder and (folder / "config.json").is_file() else recipe.source.config_file
    return read_json(Path(path)) if path else None


def _vision(recipe, mode: str, chip: str) -> dict | None:
    """The vision net's estimate for a recipe with one, priced by its family folder's `cost` module from
    config.json (InternVL: per tile; MiniCPM-V: per slice and per image)."""
    if recipe is None or recipe.vision is None:
        return None
    from llmbuild.families.registry import family_part

    full = _hf_config(recipe)
    return family_part(recipe.vision.family, "cost").estimate(full, mode, chip) if full is not None else None

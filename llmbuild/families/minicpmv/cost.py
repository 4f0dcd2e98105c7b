"""MiniCPM-V's vit net priced for `llmbuild estimate`: per slice of its static net (every piece is padded to
the net's capacity), and per image of the overview and the most slices."""

from __future__ import annotations

from typing import Any

from llmbuild import LlmbuildError
from llmbuild.cost.vision_estimate import net_seconds
from llmbuild.families.minicpmv.family import vit_geometry
from llmbuild.quant.scheme import activation_dtype


def vit_flops(c: int, i: int, layers: int, patch: int, tokens: int, queries: int, embed: int) -> tuple[int, int]:
    """(flops, weights) of one run of MiniCPM-V's static vit net: SigLIP over `tokens` patch rows (the net's
    capacity: a piece is padded to it) and the resampler. The queries' projection is a constant of the
    graph (folded at import), so it costs nothing per run:
        patch embedding   2 T C 3 p^2
        each layer        2 T (4 C^2 + 2 C I) + 2 * 2 T^2 C
        resampler         2 T C E (kv_proj) + 2 * 2 T E^2 (keys, values) + 2 * 2 Q T E (attention)
                          + 2 * 2 Q E^2 (out_proj, proj)"""
    flops = 2 * tokens * c * 3 * patch * patch
    flops += layers * (2 * tokens * (4 * c * c + 2 * c * i) + 4 * tokens * tokens * c)
    flops += 2 * tokens * c * embed + 4 * tokens * embed * embed + 4 * queries * tokens * embed
    flops += 4 * queries * embed * embed
    weights = 3 * patch * patch * c + layers * (4 * c * c + 2 * c * i) + c * embed + 4 * embed * embed
    return flops, weights


def estimate(config: dict[str, Any], mode: str, chip: str) -> dict[str, float]:
    """MiniCPM-V's vit net per slice and per image (the overview and up to max_slice_nums slices), from
    config.json (`vision_config`, `slice_config`, `query_num`, `hidden_size`)."""
    try:
        vc = config["vision_config"]
        c, i, layers = int(vc["hidden_size"]), int(vc["intermediate_size"]), int(vc["num_hidden_layers"])
        geo = vit_geometry(config)
    except (KeyError, TypeError, ValueError) as exc:
        raise LlmbuildError(f"config.json: expected vision_config (hidden_size, intermediate_size, "
                            f"num_hidden_layers), slice_config, query_num and hidden_size ({exc})") from None
    flops, weights = vit_flops(c, i, layers, geo["patch"], geo["max_patches"], geo["queries"],
                               geo["embed_dim"])
    dtype = activation_dtype(mode)
    weight_bytes = weights * (4 if dtype == "f32" else 2)
    per_slice = net_seconds(flops, weight_bytes, dtype, chip)
    pieces = 1 + geo["max_slices"]
    return {"vision_encode_s": per_slice, "vision_encode_image_s": pieces * per_slice,
            "vision_pieces_per_image": float(pieces), "vision_flops": float(flops),
            "vision_weight_bytes": float(weight_bytes), "vision_tokens_per_tile": float(geo["queries"]),
            "vision_patches_per_slice": float(geo["max_patches"]), "image_size": geo["scale"]}


def tower_size(source: Any, vision: Any, text_hidden: int) -> None:
    """No tower size for the steps' resources: the steps' defaults hold MiniCPM-V's (steps/resources.py)."""
    return None

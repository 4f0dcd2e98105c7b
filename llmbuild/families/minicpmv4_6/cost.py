"""MiniCPM-V 4.6's vit net priced for `llmbuild estimate`: per piece of its static net (every piece is padded to
the net's capacity), and per image of the overview and the most slices."""

from __future__ import annotations

from typing import Any

from llmbuild import LlmbuildError
from llmbuild.cost.vision_estimate import net_seconds
from llmbuild.families.minicpmv4_6.family import vit_geometry
from llmbuild.quant.scheme import activation_dtype


def vit_flops(c: int, i: int, layers: int, insert: int, patch: int, tokens: int, embed: int) -> tuple[int, int]:
    """(flops, weights) of one run of the static vit net over `tokens` patch rows (its capacity). The layers up
    to `insert` run on T rows, the rest on T/4; the window merger's attention runs over all T rows under a
    block-diagonal mask (as compiled), its MLP on T/4 rows of 4C; the merger on T/16 rows of 4C:
        patch embedding   2 T C 3 p^2
        a layer on R rows 2 R (4 C^2 + 2 C I) + 2 * 2 R^2 C
        window merger     2 T 4 C^2 + 2 * 2 T^2 C + 2 (T/4) (4C 4I + 4I C)
        merger            2 (T/16) (4C 4C + 4C E)"""
    def layer(rows: int) -> int:
        return 2 * rows * (4 * c * c + 2 * c * i) + 4 * rows * rows * c

    before = min(insert + 1, layers)
    flops = 2 * tokens * c * 3 * patch * patch + before * layer(tokens) + (layers - before) * layer(tokens // 4)
    flops += 8 * tokens * c * c + 4 * tokens * tokens * c + 2 * (tokens // 4) * (16 * c * i + 4 * i * c)
    flops += 2 * (tokens // 16) * (16 * c * c + 4 * c * embed)
    weights = 3 * patch * patch * c + layers * (4 * c * c + 2 * c * i) + 4 * c * c + 20 * c * i + 16 * c * c \
        + 4 * c * embed
    return flops, weights


def estimate(config: dict[str, Any], mode: str, chip: str) -> dict[str, float]:
    """The vit net per piece and per image (the overview and up to max_slices slices), from config.json."""
    try:
        vc = config["vision_config"]
        c, i, layers = int(vc["hidden_size"]), int(vc["intermediate_size"]), int(vc["num_hidden_layers"])
        geo = vit_geometry(config)
    except (KeyError, TypeError, ValueError) as exc:
        raise LlmbuildError(f"config.json: expected vision_config (hidden_size, intermediate_size, "
                            f"num_hidden_layers), image_size and text_config.hidden_size ({exc})") from None
    flops, weights = vit_flops(c, i, layers, geo["insert"], geo["patch"], geo["capacity"], geo["embed_dim"])
    dtype = activation_dtype(mode)
    weight_bytes = weights * (4 if dtype == "f32" else 2)
    per_piece = net_seconds(flops, weight_bytes, dtype, chip)
    pieces = 1 + geo["max_slices"]
    square = (geo["scale"] // geo["patch"]) ** 2 // 16  # the rows of a square slice
    return {"vision_encode_s": per_piece, "vision_encode_image_s": pieces * per_piece,
            "vision_pieces_per_image": float(pieces), "vision_flops": float(flops),
            "vision_weight_bytes": float(weight_bytes), "vision_tokens_per_tile": float(square),
            "vision_patches_per_slice": float(geo["capacity"]), "image_size": geo["scale"]}


def tower_size(source: Any, vision: Any, text_hidden: int) -> None:
    """No tower size for the steps' resources: the steps' defaults hold a tiny MiniCPM-V 4.6's."""
    return None

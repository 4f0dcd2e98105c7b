"""The vision tower's cost for one tile, from its configuration alone: what `llmbuild estimate` reports next
to first-token latency for a vision-language recipe (a built binary's perf.json times the compiled vit net).
A family whose net differs (MiniCPM-V's, per slice) prices it in its folder's `cost` module with `net_seconds`.

InternViT's work per tile, T = (image / patch)^2 + 1 tokens of width C, L layers, MLP width I:
    patch embedding   2 * (T - 1) * C * 3 * patch^2
    each layer        2 * T * (4 C^2 + 2 C I)  (q, k, v, o and the MLP)  +  2 * 2 * T^2 * C  (attention)
    projector         2 * T' * (4C * H + H * H), T' = (T - 1) / 4 rows after the 2x2 pixel shuffle
The tile is bound by whichever is slower at the chip's fitted efficiencies: the MAC array on those flops,
or DDR reading the tower's weights once; one net launch on top.
"""

from __future__ import annotations

from typing import Any

from llmbuild import LlmbuildError
from llmbuild.chips import load_chip
from llmbuild.cost.efficiency import efficiency_for
from llmbuild.cost.hardware import Rates
from llmbuild.quant.scheme import activation_dtype


def _size(value: Any) -> int:
    return int(value[0] if isinstance(value, list | tuple) else value)


def vision_estimate(vision_config: dict[str, Any], text_hidden: int, mode: str, chip: str) -> dict[str, float]:
    """Seconds, flops and weight bytes of one tile of an InternVL tower (`vision_config`: config.json's)."""
    try:
        c, i = int(vision_config["hidden_size"]), int(vision_config["intermediate_size"])
        layers = int(vision_config["num_hidden_layers"])
        image, patch = _size(vision_config["image_size"]), _size(vision_config["patch_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise LlmbuildError(f"vision_config: expected hidden_size, intermediate_size, num_hidden_layers, "
                            f"image_size and patch_size ({exc})") from None
    tokens = (image // patch) ** 2 + 1
    rows = (tokens - 1) // 4
    flops = 2 * (tokens - 1) * c * 3 * patch * patch
    flops += layers * (2 * tokens * (4 * c * c + 2 * c * i) + 4 * tokens * tokens * c)
    flops += 2 * rows * (4 * c * text_hidden + text_hidden * text_hidden)
    weights = 3 * patch * patch * c + layers * (4 * c * c + 2 * c * i) + 4 * c * text_hidden + text_hidden ** 2
    dtype = activation_dtype(mode)
    weight_bytes = weights * (4 if dtype == "f32" else 2)  # the tower is stored in the activations' type
    return {"vision_encode_s": net_seconds(flops, weight_bytes, dtype, chip), "vision_flops": float(flops),
            "vision_weight_bytes": float(weight_bytes), "vision_tokens_per_tile": float(rows)}


def net_seconds(flops: float, weight_bytes: float, dtype: str, chip: str) -> float:
    """One run of a vision net: the slower of the MAC array on its flops and DDR reading its weights once
    (at the chip's fitted efficiencies), plus one net launch."""
    target = load_chip(chip)
    rates = Rates(target)
    eff, _ = efficiency_for(target.name)
    compute = flops / (rates.mac_flops_per_s(dtype) * eff.mac)
    dma = weight_bytes / (rates.ddr_bytes_per_s * eff.ddr)
    return eff.launch_s + max(compute, dma)

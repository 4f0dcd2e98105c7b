"""InternVL's tower priced for `llmbuild estimate` (per tile, from its configuration alone; a built binary's
perf.json times the compiled vit net), and sized for the steps' declared resources (`tower_size`).

InternViT's work per tile, T = (image / patch)^2 + 1 tokens of width C, L layers, MLP width I:
    patch embedding   2 * (T - 1) * C * 3 * patch^2
    each layer        2 * T * (4 C^2 + 2 C I)  (q, k, v, o and the MLP)  +  2 * 2 * T^2 * C  (attention)
    projector         2 * T' * (4C * H + H * H), T' = (T - 1) / 4 rows after the 2x2 pixel shuffle
The tile is bound by whichever is slower at the chip's fitted efficiencies: the MAC array on those flops,
or DDR reading the tower's weights once; one net launch on top (cost/vision_estimate.net_seconds).
"""

from __future__ import annotations

from typing import Any

from llmbuild import LlmbuildError
from llmbuild.cost.vision_estimate import net_seconds
from llmbuild.families.internvl.config import recipe_vision_config
from llmbuild.families.internvl.family import text_config
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


def estimate(config: dict[str, Any], mode: str, chip: str) -> dict[str, float] | None:
    """One tile of the tower of config.json (`config`, in either layout: its `vision_config` as saved), with
    the tile's size; the projector ends at the language model's width (`family.text_config`'s). None when
    the config has no vision_config."""
    vision_config = config.get("vision_config")
    if not isinstance(vision_config, dict):
        return None
    try:
        text_hidden = int(text_config(config)["hidden_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise LlmbuildError(f"config.json: expected the language model's hidden_size ({exc})") from None
    return {**vision_estimate(vision_config, text_hidden, mode, chip),
            "image_size": _size(vision_config.get("image_size"))}


def tower_size(source: Any, vision: Any, text_hidden: int) -> dict[str, int] | None:
    """The tower's sizes the steps' resources are declared from (steps/resources.py's `Tower`), from the
    recipe's configuration (config.py: either layout), or None where it does not say: `weights` (the vit net's:
    patch embedding, positions, layers, projector), `layer` (one encoder layer's), `activations` (tokens x the
    tower's widest row, the MLP's, one tile) and `held` (bytes of every op's output for one tile: q, k, v,
    attention, o, norms and residuals ~10 rows of width c, the MLP ~3 of i)."""
    config = recipe_vision_config(source, vision)
    if config is None:
        return None
    c, i, layers = int(config["hidden_size"]), int(config["intermediate_size"]), int(config["num_hidden_layers"])
    patch = _size(config.get("patch_size", 14))
    tokens = (_size(config.get("image_size", 448)) // patch) ** 2 + 1
    layer = 4 * c * c + 2 * c * i
    weights = 3 * patch * patch * c + tokens * c + layers * layer + 4 * c * text_hidden
    held = 4 * layers * tokens * (10 * c + 3 * i)
    return {"weights": weights + text_hidden * text_hidden, "layer": layer,
            "activations": tokens * max(i, 4 * c), "held": held}

"""A synthetic MiniCPM-V 2.6 checkpoint, reproducible to the byte: `vpm.*` (SigLIP), `resampler.*`, `llm.*`.

Written beside a synthetic Qwen2 text checkpoint (`vlm/` inside it), as InternVL's is: the same text weights
under the names MiniCPM-V's checkpoint gives them (`llm.model.*`, `llm.lm_head.*`), the same tokenizer
(which then holds MiniCPM-V's image tokens), and a config.json in the published layout (the Qwen2 fields at
the top level, `vision_config`, `query_num`, `slice_config`). Tensor names and shapes are those the torch
modules of model.py have (built on the meta device); values come from numpy in sorted name
order, so the bytes do not depend on torch's generator.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError

# MiniCPM-V 2.6's image tokens: an image's overview, a slice, the rows the features fill, the image's index.
SLICE_DEFAULTS = {"max_slice_nums": 9, "patch_size": 14, "scale_resolution": 448}


def vlm_config(text_config: Mapping[str, Any], vision: Mapping[str, Any]) -> dict[str, Any]:
    """MiniCPM-V's config.json: the text model's fields at the top level, and the vision fields."""
    vc = dict(vision.get("vision_config", {}))
    slices = {**SLICE_DEFAULTS, "patch_size": vc.get("patch_size", 14), **dict(vision.get("slice_config", {}))}
    fields = {k: v for k, v in vision.items() if k not in ("vision_config", "slice_config", "model_type")}
    return {
        **dict(text_config),
        "model_type": "minicpmv",
        "architectures": ["MiniCPMV"],
        "vision_config": {"model_type": "siglip", "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6, **vc},
        "slice_config": slices,
        "slice_mode": True,
        "use_image_id": True,
        "batch_vision_input": True,
        "drop_vision_last_layer": False,
        "query_num": 64,
        **fields,
    }


def vision_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every `vpm.*` and `resampler.*` tensor of the MiniCPM-V vision path for `config`, by its name."""
    import torch

    from llmbuild.families.minicpmv.family import RESAMPLER, VPM
    from llmbuild.families.minicpmv.model import build_modules

    try:
        with torch.device("meta"):
            tower, resampler = build_modules(dict(config))
    except LlmbuildError:
        raise
    except Exception as exc:  # noqa: BLE001 - a bad vision.config field; the user gets one line
        raise LlmbuildError(f"vision.config: the MiniCPM-V vision path cannot be built from it: {exc}") from None
    return {**{VPM + k: tuple(v.shape) for k, v in tower.state_dict().items()},
            **{RESAMPLER + k: tuple(v.shape) for k, v in resampler.state_dict().items()}}


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    # Norm gains near one, modest biases and embeddings, 1/sqrt(fan_in) products: the rows reach the language
    # model at about its embeddings' scale (ln_post then `proj`), so an image changes what it generates.
    if name.endswith(("norm.weight", "norm1.weight", "norm2.weight", "ln_q.weight", "ln_kv.weight",
                      "ln_post.weight")):
        return (1.0 + rng.uniform(-0.1, 0.1, size=shape)).astype(np.float32)
    if name.endswith("bias"):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith(("position_embedding.weight", "resampler.query")):
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    if name == "resampler.proj":  # x @ proj: [in, out]
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
    fan_in = int(np.prod(shape[1:]))
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def write_synthetic(text_dir: Path, text_config: Mapping[str, Any], text_tensors: Mapping[str, np.ndarray],
                             vision: Mapping[str, Any], seed: int) -> None:
    """`text_dir/vlm/`: config.json, model.safetensors (the text tensors under `llm.`, the vision tensors
    drawn from `seed`) and the tokenizer files of `text_dir`."""

    from llmbuild.frontend.synthetic_vlm import write_vlm_dir

    config = vlm_config(text_config, vision)
    rng = np.random.default_rng([seed, 2])
    shapes = vision_shapes(config)
    tensors = {name: _init(rng, name, shapes[name]) for name in sorted(shapes)}
    tensors.update({"llm." + name: value for name, value in text_tensors.items()})
    write_vlm_dir(Path(text_dir), config, tensors)

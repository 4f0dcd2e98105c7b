"""A synthetic InternVL checkpoint in transformers' native layout, reproducible to the byte.

Written beside a synthetic text checkpoint (`vlm/` inside it), with the same text weights under the
vision-language model's names and the same tokenizer (which then holds InternVL's image tokens), so that
the language model builds exactly as a text recipe does and transformers' `InternVLForConditionalGeneration`
loads the whole model offline as the independent reference. Tensor names and shapes are those transformers
gives the configuration (its model built on the meta device, no memory); values come from numpy in sorted
name order, so the bytes do not depend on torch's generator.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.families.internvl.config import DEFAULT_IMAGE_TOKEN_ID, tokenizer_image_token_id


def vlm_config(text_config: Mapping[str, Any], vision: Mapping[str, Any],
               image_token_id: int = DEFAULT_IMAGE_TOKEN_ID) -> dict[str, Any]:
    """The config.json of the vision-language model: InternVL's fields around the text model's config.
    `image_token_id`: the tokenizer's <IMG_CONTEXT> (`llmbuild estimate` reads only the sizes)."""
    fields = {k: v for k, v in vision.items() if k != "vision_config"}
    return {
        "model_type": "internvl",
        "architectures": ["InternVLForConditionalGeneration"],
        "text_config": dict(text_config),
        "vision_config": {"model_type": "internvl_vision", **dict(vision.get("vision_config", {}))},
        "image_token_id": image_token_id,
        "downsample_ratio": 0.5,
        "projector_hidden_act": "gelu",
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "default",
        "tie_word_embeddings": bool(text_config.get("tie_word_embeddings", False)),
        "torch_dtype": "float32",
        **fields,
    }


def vision_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every vision tower and projector tensor transformers' InternVL has for `config`, by its name."""
    import torch
    import transformers

    try:
        cfg = transformers.InternVLConfig(**{k: v for k, v in config.items() if k not in ("model_type",
                                                                                        "architectures")})
        with torch.device("meta"):
            model = transformers.InternVLForConditionalGeneration(cfg)
    except Exception as exc:  # noqa: BLE001 - a bad vision.config field; the user gets one line
        raise LlmbuildError(f"vision.config: transformers cannot build InternVL from it: {exc}") from None
    return {k: tuple(v.shape) for k, v in model.state_dict().items()
            if k.startswith(("model.vision_tower.", "model.multi_modal_projector."))}


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    # Norm gains near one and biases, layer scales and embeddings of modest size: the features then reach
    # the language model at about its embeddings' scale, so an image changes what it generates.
    if name.endswith(("norm.weight", "layernorm_before.weight", "layernorm_after.weight")):
        return (1.0 + rng.uniform(-0.1, 0.1, size=shape)).astype(np.float32)
    if name.endswith(".bias"):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if ".lambda_" in name:
        return (0.5 + 0.5 * rng.uniform(size=shape)).astype(np.float32)
    if name.endswith(("cls_token", "position_embeddings")):
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    fan_in = int(np.prod(shape[1:]))
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def write_synthetic(text_dir: Path, text_config: Mapping[str, Any], text_tensors: Mapping[str, np.ndarray],
                    vision: Mapping[str, Any], seed: int) -> None:
    """`text_dir/vlm/`: config.json, model.safetensors (the text tensors renamed, the vision tensors drawn
    from `seed`) and the tokenizer files of `text_dir` (whose <IMG_CONTEXT> id config.json names)."""
    from llmbuild.frontend.synthetic_vlm import write_vlm_dir

    image_token_id = tokenizer_image_token_id(Path(text_dir))
    if image_token_id is None:
        raise LlmbuildError(f"{Path(text_dir) / 'tokenizer.json'}: no '<IMG_CONTEXT>' token (the synthetic "
                            "tokenizer of an InternVL checkpoint has its image tokens)")
    config = vlm_config(text_config, vision, image_token_id)
    rng = np.random.default_rng([seed, 1])
    shapes = vision_shapes(config)
    tensors = {name: _init(rng, name, shapes[name]) for name in sorted(shapes)}
    for name, value in text_tensors.items():
        tensors[name if name.startswith("lm_head.") else "model.language_model." + name.removeprefix("model.")] = value
    write_vlm_dir(Path(text_dir), config, tensors)

"""A synthetic MiniCPM-V 4.6 checkpoint in transformers' native `minicpmv4_6` layout, reproducible to the byte.

Written beside a synthetic Qwen3.5 text checkpoint (`vlm/` inside it), as InternVL's is: the same text weights
under the names `MiniCPMV4_6ForConditionalGeneration` gives them (`model.language_model.*`, `lm_head.*`), the
same tokenizer (which then holds MiniCPM-V's image tokens), and a config.json with `text_config` (the
`qwen3_5_text` fields), `vision_config` and `image_token_id` (the `<unk>` rows the features fill). Tensor names
and shapes are those transformers' model has (built on the meta device); values come from numpy in sorted
name order, so the bytes do not depend on torch's generator.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.families.minicpmv4_6.family import PROCESSOR_DEFAULTS, PROCESSOR_FILE, model_config_fields

VISION_PREFIXES = ("model.vision_tower.", "model.merger.")
# Fields of vision.config that are the whole model's, not the tower's.
TOP_FIELDS = ("insert_layer_id", "image_size", "drop_vision_last_layer", "downsample_mode", "merge_kernel_size",
              "merger_times")
# Fields of vision.config that are the image processor's: written to preprocessor_config.json, as the published
# checkpoint keeps them (its processor slices at its scale_resolution, whatever config.json's image_size says).
PROCESSOR_FIELDS = ("scale_resolution", "max_slice_nums")


def vlm_config(text_config: Mapping[str, Any], vision: Mapping[str, Any],
               image_token_id: int | None = None) -> dict[str, Any]:
    """MiniCPM-V 4.6's config.json around the text model's config (`image_token_id`: `<unk>`'s id in the
    tokenizer; absent where only the sizes matter, `llmbuild estimate`)."""
    vc = dict(vision.get("vision_config", {}))
    fields = {k: v for k, v in vision.items() if k in TOP_FIELDS}
    text = {**dict(text_config), "model_type": "qwen3_5_text"}
    text.pop("architectures", None)
    return {
        "model_type": "minicpmv4_6",
        "architectures": ["MiniCPMV4_6ForConditionalGeneration"],
        "text_config": text,
        "vision_config": {"model_type": "minicpmv4_6_vision", "hidden_act": "gelu_pytorch_tanh",
                          "layer_norm_eps": 1e-6, **vc},
        "image_token_id": image_token_id,
        "insert_layer_id": 6,
        "drop_vision_last_layer": False,
        "downsample_mode": "16x",
        "merge_kernel_size": [2, 2],
        "merger_times": 1,
        "tie_word_embeddings": bool(text_config.get("tie_word_embeddings", False)),
        "torch_dtype": "float32",
        **{k: text_config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in text_config},
        **fields,
    }


def native_model(config: Mapping[str, Any], device: str = "cpu") -> Any:
    """transformers' MiniCPMV4_6ForConditionalGeneration for `config`, untrained, on `device`."""
    import torch
    import transformers

    try:
        cfg = transformers.MiniCPMV4_6Config(**model_config_fields(dict(config)))
        with torch.device(device):
            return transformers.MiniCPMV4_6ForConditionalGeneration(cfg)
    except Exception as exc:  # noqa: BLE001 - a bad vision.config field; the user gets one line
        raise LlmbuildError(f"vision.config: transformers cannot build MiniCPM-V 4.6 from it: {exc}") from None


def vision_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every vision tower and merger tensor of transformers' MiniCPM-V 4.6 for `config`, by its name."""
    model = native_model(config, "meta")
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if k.startswith(VISION_PREFIXES)}


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    # Norm gains near one, modest biases and embeddings, 1/sqrt(fan_in) products: the rows reach the language
    # model at about its embeddings' scale, so an image changes what it generates.
    if name.endswith(("norm.weight", "norm1.weight", "norm2.weight")):
        return (1.0 + rng.uniform(-0.1, 0.1, size=shape)).astype(np.float32)
    if name.endswith("bias"):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("position_embedding.weight"):
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    fan_in = int(np.prod(shape[1:]))
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def image_token_id(text_dir: Path) -> int:
    """The id of `<unk>` (the rows the image features fill) in the text checkpoint's tokenizer."""
    path = Path(text_dir) / "tokenizer.json"
    added = {t["content"]: t["id"] for t in json.loads(path.read_text(encoding="utf-8")).get("added_tokens", [])}
    if "<unk>" not in added:
        raise LlmbuildError(f"{path}: no '<unk>' token (MiniCPM-V 4.6's image features fill its rows)")
    return int(added["<unk>"])


def write_synthetic(text_dir: Path, text_config: Mapping[str, Any], text_tensors: Mapping[str, np.ndarray],
                    vision: Mapping[str, Any], seed: int) -> None:
    """`text_dir/vlm/`: config.json, model.safetensors (the text tensors renamed, the vision tensors drawn from
    `seed`) and the tokenizer files of `text_dir`."""
    from llmbuild.frontend.synthetic_vlm import VLM_DIR, write_vlm_dir
    from llmbuild.frontend.tokenizer_files import write_json

    config = vlm_config(text_config, vision, image_token_id(text_dir))
    rng = np.random.default_rng([seed, 3])
    shapes = vision_shapes(config)
    tensors = {name: _init(rng, name, shapes[name]) for name in sorted(shapes)}
    for name, value in text_tensors.items():
        tensors[name if name.startswith("lm_head.") else "model.language_model." + name.removeprefix("model.")] = value
    write_vlm_dir(Path(text_dir), config, tensors)
    write_json(Path(text_dir) / VLM_DIR / PROCESSOR_FILE, processor_config(vision))


def processor_config(vision: Mapping[str, Any]) -> dict[str, Any]:
    """preprocessor_config.json as the published checkpoint has it, with vision.config's processor fields."""
    patch = int(vision.get("vision_config", {}).get("patch_size", 14))
    return {"image_processor_type": "MiniCPMV4_6ImageProcessor", "processor_class": "MiniCPMV4_6Processor",
            **PROCESSOR_DEFAULTS, **{k: int(vision[k]) for k in PROCESSOR_FIELDS if k in vision},
            "patch_size": patch, "use_image_id": True, "slice_mode": True, "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5]}

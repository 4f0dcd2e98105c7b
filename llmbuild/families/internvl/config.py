"""InternVL's config.json in either of its layouts, read as transformers' native `internvl` one.

The published InternVL checkpoints (OpenGVLab/InternVL3-2B, what TPU-MLIR reads) are saved by the model's
own remote code: config.json is an `InternVLChatConfig` (`llm_config`, `vision_config`, `downsample_ratio`,
`template`, `ps_version`, ...). `native_config` translates it to the fields of transformers'
`InternVLConfig` (transformers' own conversion script's table, models/internvl/
convert_internvl_weights_to_hf.py, not installed with the wheel), refusing in one line what it cannot
translate; a native config passes as it is. Everything that reads an InternVL directory's configuration
(the text model's config, the vision export, the streamed references, the cost model, `llmbuild compile`)
goes through it, so both layouts build the same binary; model.py's `TensorView` does the same for the
tensors. json only: the description's layer (no frontend, no torch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError
from llmbuild.json_file import read_json

CHAT_MODEL_TYPE = "internvl_chat"
IMAGE_CONTEXT = "<IMG_CONTEXT>"
DEFAULT_IMAGE_TOKEN_ID = 151667  # InternVLConfig's default: Qwen2 tokenizers' <IMG_CONTEXT>

# InternVisionConfig field -> InternVLVisionConfig field, where the names differ.
_VISION_FIELDS = {"qkv_bias": "attention_bias", "qk_normalization": "use_qk_norm",
                  "attention_dropout": "attention_dropout", "dropout": "hidden_dropout_prob"}
_VISION_KEPT = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_channels",
                "hidden_act", "norm_type", "layer_norm_eps", "initializer_range")
_VISION_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "patch_size")
# llm_config keys of the remote code's configs that transformers' text configs do not have (the script's list).
_LLM_DROPPED = ("_name_or_path", "_attn_implementation_autoset", "auto_map", "use_bfloat16", "use_flash_attn",
                "attn_implementation")
# Fields config.json sets at the top level for the whole model (InternVLConfig keeps them there too).
_TOP_LEVEL = ("torch_dtype", "dtype")


def is_internvl_chat(cfg: dict[str, Any]) -> bool:
    return cfg.get("model_type") == CHAT_MODEL_TYPE or "llm_config" in cfg


def _square(value: Any, origin: str, field: str) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return [value, value]
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value):
        return list(value)
    raise LlmbuildError(f"{origin}: {field}: expected a positive integer or a pair, got {value!r}")


def native_config(cfg: dict[str, Any], origin: str = "config.json", image_token_id: int | None = None
                  ) -> dict[str, Any]:
    """config.json's fields as transformers' native InternVLConfig has them (a native config as it is).
    `image_token_id`: the tokenizer's <IMG_CONTEXT> id (the chat config does not say it)."""
    if not is_internvl_chat(cfg):
        return cfg
    llm, vision = cfg.get("llm_config"), cfg.get("vision_config")
    if not isinstance(llm, dict):
        raise LlmbuildError(f"{origin}: llm_config: expected the language model's configuration (an object)")
    if not isinstance(vision, dict):
        raise LlmbuildError(f"{origin}: vision_config: expected the vision tower's configuration (an object)")
    missing = [f for f in _VISION_REQUIRED if f not in vision]
    if missing:
        raise LlmbuildError(f"{origin}: vision_config.{missing[0]}: missing")
    if not isinstance(llm.get("model_type"), str):
        raise LlmbuildError(f"{origin}: llm_config.model_type: missing")
    # transformers' pixel_shuffle is InternVL's v2; v1 (InternVL 1.5's early checkpoints) transposes apart.
    if cfg.get("ps_version", "v2") != "v2":
        raise LlmbuildError(f"{origin}: ps_version: {cfg['ps_version']!r} is not supported (only 'v2', the "
                            "pixel shuffle transformers' InternVL implements)")
    if cfg.get("select_layer", -1) != -1:
        raise LlmbuildError(f"{origin}: select_layer: {cfg['select_layer']!r} is not supported (only -1: the "
                            "tower's last layer)")
    size = cfg.get("force_image_size") or vision.get("image_size", 448)
    text = {k: v for k, v in llm.items() if k not in _LLM_DROPPED}
    out_vision: dict[str, Any] = {k: vision[k] for k in _VISION_KEPT if k in vision}
    out_vision.update({new: vision[old] for old, new in _VISION_FIELDS.items() if old in vision})
    out_vision["projection_dropout"] = vision.get("attention_dropout", 0.0)
    out_vision.update(model_type="internvl_vision", use_absolute_position_embeddings=True,
                      image_size=_square(size, origin, "vision_config.image_size"),
                      patch_size=_square(vision["patch_size"], origin, "vision_config.patch_size"))
    patches = out_vision["image_size"][0] // out_vision["patch_size"][0]
    ratio = float(cfg.get("downsample_ratio", 0.5))
    native = {
        "model_type": "internvl",
        "architectures": ["InternVLForConditionalGeneration"],
        "text_config": text,
        "vision_config": out_vision,
        "downsample_ratio": ratio,
        "image_token_id": DEFAULT_IMAGE_TOKEN_ID if image_token_id is None else image_token_id,
        "image_seq_length": int(round(patches * ratio) ** 2),
        "projector_hidden_act": "gelu",  # mlp1's activation: nn.GELU() in the remote code
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "default",
        "tie_word_embeddings": bool(llm.get("tie_word_embeddings", False)),
    }
    native.update({k: cfg[k] for k in _TOP_LEVEL if k in cfg})
    return native


def tokenizer_image_token_id(directory: Path) -> int | None:
    """The id of <IMG_CONTEXT> in the directory's tokenizer.json (or added_tokens.json), if it has one."""
    tokenizer = Path(directory) / "tokenizer.json"
    if tokenizer.is_file():
        added = read_json(tokenizer).get("added_tokens", [])
        ids = [t.get("id") for t in added if isinstance(t, dict) and t.get("content") == IMAGE_CONTEXT]
        if ids and isinstance(ids[0], int):
            return ids[0]
    added_file = Path(directory) / "added_tokens.json"
    if added_file.is_file():
        value = read_json(added_file).get(IMAGE_CONTEXT)
        return value if isinstance(value, int) else None
    return None


def read_native_config(directory: Path) -> dict[str, Any]:
    """The directory's config.json in the native layout's fields, whichever layout it is saved in."""
    path = Path(directory) / "config.json"
    cfg = read_json(path)
    if not is_internvl_chat(cfg):
        return cfg
    return native_config(cfg, str(path), tokenizer_image_token_id(Path(directory)))




def recipe_vision_config(source: Any, vision: Any) -> dict[str, Any] | None:
    """The native vision_config (InternVLVisionConfig's fields) of a recipe's vision-language model, from its
    configuration alone: a synthetic recipe's vision.config, an hf checkpoint's config.json in either layout,
    or the recipe's shipped source.config_file while the checkpoint is absent. None when none says."""
    if vision is None:
        return None
    config = (vision.config or {}).get("vision_config") if getattr(vision, "config", None) else None
    if config is None and getattr(source, "kind", None) == "hf":
        folder = Path(source.path) if source.path else None
        if folder is not None and (folder / "config.json").is_file():
            config = read_native_config(folder).get("vision_config")
        elif source.config_file:
            path = Path(source.config_file)
            config = native_config(read_json(path), str(path)).get("vision_config")
    return config if isinstance(config, dict) else None

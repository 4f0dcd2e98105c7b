"""InternVL's original `internvl_chat` checkpoint layout, presented as transformers' native `internvl` one.

The published InternVL checkpoints (OpenGVLab/InternVL3-2B, what TPU-MLIR reads) are saved by the model's
own remote code: config.json is an `InternVLChatConfig` (`llm_config`, `vision_config`, `downsample_ratio`,
`template`, `ps_version`, ...) and the tensors are named

    vision_model.embeddings.{class_embedding, patch_embedding, position_embedding}
    vision_model.encoder.layers.N.{attn.qkv (q, k, v fused), attn.proj, ls1, ls2, norm1, norm2, mlp.fc1, mlp.fc2}
    mlp1.{0 (LayerNorm), 1 (Linear), 3 (Linear)}
    language_model.model.*, language_model.lm_head.weight

The mapping is transformers' own conversion script's (models/internvl/convert_internvl_weights_to_hf.py,
not installed with the wheel): `vision_model` -> `vision_tower`, `layers` -> `layer`, `class_embedding` ->
`cls_token`, `position_embedding` -> `position_embeddings`, `patch_embedding` ->
`patch_embeddings.projection`, `lsN` -> `lambda_N`, `attn.proj` -> `attention.projection_layer`, `attn` ->
`attention`, `norm1`/`norm2` -> `layernorm_before`/`layernorm_after`, `mlp1.0/1/3` ->
`multi_modal_projector.layer_norm/linear_1/linear_2`, and `attn.qkv` split in three equal row blocks
(q, k, v; weight and bias alike). A Qwen2 language model keeps its names.

Nothing is converted on disk: `TensorView` maps native names to (file, stored name, rows) and reads one
tensor (one third of a fused qkv) when asked, so a 2B checkpoint is never held, and `native_config`
translates config.json to the fields of transformers' `InternVLConfig`. Everything that reads a
vision-language directory goes through these two (the text model's config and names, the vision export,
the streamed references), so both layouts build the same binary.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError
from llmbuild.frontend.json_file import read_json

CHAT_MODEL_TYPE = "internvl_chat"
IMAGE_CONTEXT = "<IMG_CONTEXT>"
DEFAULT_IMAGE_TOKEN_ID = 151667  # InternVLConfig's default: Qwen2 tokenizers' <IMG_CONTEXT>
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# (pattern, replacement) applied in order to a vision_model.* name: the conversion script's table.
_VISION_RULES = (
    (r"^vision_model\.", "vision_tower."),
    (r"\.layers\.", ".layer."),
    (r"\.class_embedding$", ".cls_token"),
    (r"\.position_embedding$", ".position_embeddings"),
    (r"\.patch_embedding\.", ".patch_embeddings.projection."),
    (r"\.ls(\d+)$", r".lambda_\1"),
    (r"\.attn\.proj\.", ".attention.projection_layer."),
    (r"\.attn\.", ".attention."),
    (r"\.norm1\.", ".layernorm_before."),
    (r"\.norm2\.", ".layernorm_after."),
)
_PROJECTOR = {"mlp1.0.": "multi_modal_projector.layer_norm.", "mlp1.1.": "multi_modal_projector.linear_1.",
              "mlp1.3.": "multi_modal_projector.linear_2."}
_QKV = ".attention.qkv."
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


def load_config(directory: Path) -> Any:
    """transformers' config object for the directory (an InternVLConfig for either InternVL layout)."""
    import transformers

    cfg = read_json(Path(directory) / "config.json")
    if not is_internvl_chat(cfg):
        return transformers.AutoConfig.from_pretrained(Path(directory), local_files_only=True)
    return transformers.InternVLConfig(**read_native_config(directory))


def native_name(stored: str) -> str | None:
    """The native module name (`model.vision_tower...`, `model.multi_modal_projector...`,
    `model.language_model...`, `lm_head.weight`) of an internvl_chat tensor; a fused qkv keeps `qkv`
    (TensorView splits it); None for a tensor of no known part."""
    if stored.startswith("vision_model."):
        name = stored
        for pattern, replacement in _VISION_RULES:
            name = re.sub(pattern, replacement, name)
        return "model." + name
    for old, new in _PROJECTOR.items():
        if stored.startswith(old):
            return "model." + new + stored[len(old):]
    if stored.startswith("language_model.model."):
        return "model.language_model." + stored[len("language_model.model."):]
    if stored.startswith("language_model.lm_head."):
        return stored[len("language_model."):]
    return None


def _module_name(stored: str) -> str:
    """A native-layout tensor's module name: the -hf uploads save `language_model.model.*`, `vision_tower.*`,
    `multi_modal_projector.*` and `language_model.lm_head.*`; transformers 5 saves the module names."""
    if stored.startswith(("language_model.model.", "language_model.lm_head.")):
        return native_name(stored) or stored
    return stored if stored.startswith(("model.", "lm_head.")) else "model." + stored


@dataclass(frozen=True)
class Part:
    """A native tensor: the stored one in `file`, or its row block `part` of `parts` (a split qkv)."""

    file: Path
    stored: str
    part: int = 0
    parts: int = 1


def _stored_files(directory: Path) -> dict[str, Path]:
    from safetensors import safe_open

    index, single = directory / INDEX_FILE, directory / SINGLE_FILE
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise LlmbuildError(f"{index}: missing field 'weight_map'")
        return {name: directory / shard for name, shard in weight_map.items()}
    if single.is_file():
        with safe_open(str(single), framework="pt") as f:
            return dict.fromkeys(f.keys(), single)
    raise LlmbuildError(f"{directory}: no {SINGLE_FILE} or {INDEX_FILE}")


class TensorView:
    """A vision-language checkpoint's tensors under the native module names (`model.vision_tower.*`, ...),
    read one at a time as float32 torch tensors, whichever of the two layouts the directory holds."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.chat = is_internvl_chat(read_json(self.directory / "config.json"))
        self.parts: dict[str, Part] = {}
        for stored, file in sorted(_stored_files(self.directory).items()):
            name = native_name(stored) if self.chat else _module_name(stored)
            if name is None:
                continue
            if _QKV in name:
                for i, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                    self.parts[name.replace(_QKV, f".attention.{proj}.")] = Part(file, stored, i, 3)
            else:
                self.parts[name] = Part(file, stored)

    def names(self, prefix: str = "") -> Iterator[str]:
        return (name for name in self.parts if name.startswith(prefix))

    def get(self, name: str) -> Any:
        """The tensor `name` in float32 (only its rows of a fused qkv are read)."""
        import torch
        from safetensors import safe_open

        part = self.parts.get(name)
        if part is None:
            raise LlmbuildError(f"{self.directory}: missing tensor {name!r}")
        with safe_open(str(part.file), framework="pt") as f:
            sliced = f.get_slice(part.stored)
            if part.parts == 1:
                value = sliced[:]
            else:
                rows = sliced.get_shape()[0]
                if rows % part.parts:
                    raise LlmbuildError(f"{part.file}: tensor {part.stored!r} has {rows} rows, expected a "
                                        f"multiple of {part.parts} (q, k and v fused)")
                block = rows // part.parts
                value = sliced[part.part * block : (part.part + 1) * block]
        return value.to(torch.float32).contiguous()


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

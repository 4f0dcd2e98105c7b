"""MiniCPM-V 4.6, described: which config.json is one (`HF_MODEL_TYPES`), its language model's config (the
`qwen3_5_text` under `text_config`), the static vit net's sizes and its image tokens. numpy only: shared phase
packages reach it through the family registry, and the folder's other modules build on it:

- `synthetic.py`: the tiny checkpoint in transformers' native `minicpmv4_6` layout;
- `model.py`: the tower and the merger as one static graph (the vit net), and transformers' own modules.

What differs from MiniCPM-V 2.6 (families/minicpmv): the same SigLIP encoder layers, but after layer
`insert_layer_id` a window-attention merger (attention inside each 2x2 window of patches, then the window's
four rows concatenated through an MLP, plus their mean) quarters the rows; and instead of the resampler's
learned queries, a merger concatenates each 2x2 window again (LayerNorm, Linear, exact GELU, Linear). A slice
of h x w patches thus gives h*w/16 rows, not a fixed query count, and the language model is Qwen3.5's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError

HF_MODEL_TYPES = ("minicpmv4_6",)
# Where MiniCPMV4_6ForConditionalGeneration stores the language model -> lm_head's prefix (frontend/hf.py).
TEXT_PREFIXES = {"model.language_model.": ""}
# Why the vendor's .bmodel cannot be built (recipe/cross_rules.py refuses bmodel.build with it).
NO_VENDOR_EXPORT = ("a MiniCPM-V 4.6 recipe (its language model is Qwen3.5's, whose linear-attention layers have no "
                    "export to the vendor's top dialect)")
CHAT_TERMINATORS = ("<|im_end|>", "<|endoftext|>")
# The image tokens the processor writes, in the order runtime_meta reads their ids: transformers'
# MiniCPMV4_6Processor takes each from the tokenizer by name (`tokenizer.image_token`, ...), which a
# tokenizer_config.json declares in its `extra_special_tokens`; where it declares none, the tokens MiniCPM-V's
# earlier tokenizers name.
IMAGE_TOKEN_NAMES = ("image_start_token", "image_end_token", "slice_start_token", "slice_end_token", "image_token",
                     "image_id_start_token", "image_id_end_token")
IMAGE_TOKENS = ("<image>", "</image>", "<slice>", "</slice>", "<unk>", "<image_id>", "</image_id>")
TOKENIZER_CONFIG = "tokenizer_config.json"
# Patches per output row: the window merger's 2x2, then the merger's 2x2 ("16x" downsampling).
ROWS_DIVISOR = 16
# The image processor's settings, from the checkpoint's preprocessor_config.json where it has one, else
# transformers' MiniCPMV4_6ImageProcessor defaults. Not config.json's image_size: the published checkpoint's
# config.json says 1120 while its processor slices at 448, and the model was trained on what the processor
# gives.
PROCESSOR_FILE = "preprocessor_config.json"
PROCESSOR_DEFAULTS = {"scale_resolution": 448, "max_slice_nums": 9}
PROCESSOR_KEY = "preprocessor"  # where read_config puts the processor's settings beside config.json's fields


def read_config(model_dir: Path) -> dict[str, Any]:
    """A MiniCPM-V 4.6 checkpoint's config.json, with the fields the vision path needs."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise LlmbuildError(f"{path}: cannot read the MiniCPM-V 4.6 config ({type(exc).__name__})") from None
    for key in ("vision_config", "text_config", "image_token_id"):
        if key not in cfg:
            raise LlmbuildError(f"{path}: missing field {key!r} (a MiniCPM-V 4.6 config.json has vision_config, "
                                "text_config and image_token_id)")
    cfg[PROCESSOR_KEY] = read_processor(Path(model_dir))
    if cfg.get("downsample_mode", "16x") != "16x" or int(cfg.get("merger_times", 1)) != 1:
        raise LlmbuildError(f"{path}: downsample_mode {cfg.get('downsample_mode')!r}, merger_times "
                            f"{cfg.get('merger_times')}: expected '16x' and 1 (the vit net merges twice, once each)")
    return cfg


def read_processor(model_dir: Path) -> dict[str, int]:
    """The slicing settings of the checkpoint's image processor (preprocessor_config.json, where present)."""
    path = model_dir / PROCESSOR_FILE
    if not path.is_file():
        return dict(PROCESSOR_DEFAULTS)
    try:
        fields = json.loads(path.read_text(encoding="utf-8"))
        # use_image_id: whether the processor writes `<image_id>i</image_id>` before an image's placeholders
        return {**{key: int(fields.get(key, default)) for key, default in PROCESSOR_DEFAULTS.items()},
                "use_image_id": bool(fields.get("use_image_id", True))}
    except (OSError, json.JSONDecodeError, TypeError, ValueError, AttributeError) as exc:
        raise LlmbuildError(f"{path}: cannot read the image processor's scale_resolution and max_slice_nums "
                            f"({type(exc).__name__})") from None


def model_config_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """config.json's fields as transformers' MiniCPMV4_6Config takes them (not the processor's settings)."""
    return {k: v for k, v in cfg.items() if k not in ("model_type", "architectures", PROCESSOR_KEY)}


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config.json fields: `text_config` with the token ids and tying set at the top level."""
    if cfg.get("model_type") not in HF_MODEL_TYPES:
        return cfg
    text = dict(cfg["text_config"])
    inherited = ("bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings")
    return {**text, **{k: cfg[k] for k in inherited if k in cfg and k not in text}}


def vit_geometry(cfg: dict[str, Any]) -> dict[str, int]:
    """The static vit net's sizes: patch, the slicing scale (the image processor's scale_resolution), the
    net's capacity in patches, the position table's side and the text width. A config without the
    processor's settings (a shipped config.json, `llmbuild estimate`) gets the processor's defaults."""
    from llmbuild.families.minicpmv4_6.inputs import capacity

    vc = cfg["vision_config"]
    patch = int(vc.get("patch_size", 14))
    processor = {**PROCESSOR_DEFAULTS, **cfg.get(PROCESSOR_KEY, {})}
    scale = int(processor["scale_resolution"])
    return {"patch": patch, "scale": scale, "capacity": capacity(scale, patch),
            "side": int(vc.get("image_size", 224)) // patch, "embed_dim": int(cfg["text_config"]["hidden_size"]),
            "insert": int(cfg.get("insert_layer_id", 6)), "max_slices": int(processor["max_slice_nums"])}


def runtime_meta(cfg: dict[str, Any], added: dict[str, int], tokenizer_path: Path,
                 net_shapes: dict[str, tuple[int, ...]] | None = None, vision: Any = None) -> dict[str, Any]:
    """What the runtime needs to slice an image and write its placeholders (the binary's meta.vision): the
    slicing sizes, the net's capacity, and the ids of the image tokens in the tokenizer."""
    from llmbuild.families.minicpmv4_6.inputs import MEAN, STD

    tokens = image_tokens(tokenizer_path.parent / TOKENIZER_CONFIG)
    missing = [(name, t) for name, t in zip(IMAGE_TOKEN_NAMES, tokens, strict=True) if t not in added]
    if missing:
        name, token = missing[0]
        raise LlmbuildError(f"{tokenizer_path}: no {token!r} token (the {name} a MiniCPM-V 4.6 processor writes)")
    geo = vit_geometry(cfg)
    start, end, slice_start, slice_end, unk, id_start, id_end = (int(added[t]) for t in tokens)
    if unk != int(cfg["image_token_id"]):
        raise LlmbuildError(f"{tokenizer_path}: the image token {tokens[4]!r} is id {unk}, config.json's "
                            f"image_token_id is {cfg['image_token_id']}")
    use_image_id = bool(cfg.get(PROCESSOR_KEY, {}).get("use_image_id", True))
    return {"patch_size": geo["patch"], "scale_resolution": geo["scale"], "max_slices": geo["max_slices"],
            "capacity": geo["capacity"], "position_side": geo["side"], "mean": list(MEAN), "std": list(STD),
            "use_image_id": use_image_id, "image_start_id": start, "image_end_id": end, "slice_start_id": slice_start,
            "slice_end_id": slice_end, "image_token_id": unk, "image_id_start_id": id_start,
            "image_id_end_id": id_end}


def image_tokens(path: Path) -> tuple[str, ...]:
    """The image tokens in IMAGE_TOKEN_NAMES' order: those the tokenizer_config.json at `path` names in its
    `extra_special_tokens`, IMAGE_TOKENS' where it names none (or has no such file)."""
    if not path.is_file():
        return IMAGE_TOKENS
    try:
        named = json.loads(path.read_text(encoding="utf-8")).get("extra_special_tokens") or {}
    except (OSError, json.JSONDecodeError, AttributeError) as exc:
        raise LlmbuildError(f"{path}: cannot read the tokenizer's configuration ({type(exc).__name__})") from None
    if not isinstance(named, dict):  # a list of extra tokens names no role
        return IMAGE_TOKENS
    tokens = tuple(named.get(name, default) for name, default in zip(IMAGE_TOKEN_NAMES, IMAGE_TOKENS, strict=True))
    bad = [name for name, token in zip(IMAGE_TOKEN_NAMES, tokens, strict=True) if not isinstance(token, str)]
    if bad:
        raise LlmbuildError(f"{path}: extra_special_tokens.{bad[0]} is {named[bad[0]]!r}, expected a token's text")
    return tokens

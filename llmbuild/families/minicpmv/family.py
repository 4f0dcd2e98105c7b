"""MiniCPM-V 2.6, described: which config.json is one (`HF_MODEL_TYPES`), its language model's config (a Qwen2's
fields at its top level), the static vit net's sizes, its image tokens and what the runtime needs to slice an
image (the binary's meta.vision). numpy only: shared phase packages reach it through the family registry
(`family_part("minicpmv", "family")`), and the folder's other modules build on it:

- `inputs.py`: the vit net's per-piece inputs, computed on the host (numpy);
- `runtime.py`: image slicing and the prompt's placeholders, for the runtime (Pillow, numpy);
- `model.py`: the tower and resampler in torch, the ONNX export of the static vit net;
- `checkpoint.py`: the vision tensors of a checkpoint checked against the config (no torch);
- `synthetic.py`: the tiny checkpoint's vision part;
- `reference.py`: the whole model in torch, the reference of every check; `stream.py`: the same streamed;
- `verify.py`: the vision step's cases and the image end-to-end check;
- `cost.py`: the vit net's cost for `llmbuild estimate`;
- `vendor.py`: the vit net in TPU-MLIR's top dialect, the `.bmodel`'s (the inputs LLM-TPU's runtime feeds).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError
from llmbuild.families.minicpmv.inputs import MEAN, STD, max_patches

# config.json model_type values of this family (its vision.family is "minicpmv").
HF_MODEL_TYPES = ("minicpmv",)
# Where its checkpoint stores the language model -> the prefix of lm_head (frontend/hf.py reads them).
TEXT_PREFIXES = {"llm.model.": "llm."}

# None: the vendor's .bmodel is built (its `vit` net: vendor.py, with the inputs LLM-TPU's runtime feeds).
NO_VENDOR_EXPORT = None

# The checkpoint's prefixes of the tower's, the resampler's and the language model's tensors.
VPM, RESAMPLER, LLM = "vpm.", "resampler.", "llm."
# Where the published `chat()` stops generating (MiniCPM-V 2.6's modeling code: `self.terminators`), besides
# generation_config's eos_token_id.
CHAT_TERMINATORS = ("<|im_end|>", "<|endoftext|>")
# MiniCPM-V's image tokens, in the order runtime_meta reads their ids.
IMAGE_TOKENS = ("<image>", "</image>", "<slice>", "</slice>", "<unk>", "<image_id>", "</image_id>")
# The inputs of the static vit net, in order (inputs.slice_inputs fills them).
STATIC_INPUTS = ("pixel_values", "position_ids", "attention_mask", "resampler_mask", "pos_embed")


def read_config(model_dir: Path) -> dict[str, Any]:
    """A MiniCPM-V checkpoint's config.json, with the fields the vision path needs."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise LlmbuildError(f"{path}: cannot read the MiniCPM-V config ({type(exc).__name__})") from None
    for key in ("vision_config", "query_num", "hidden_size", "slice_config"):
        if key not in cfg:
            raise LlmbuildError(f"{path}: missing field {key!r} (a MiniCPM-V config.json has vision_config, "
                                "query_num, hidden_size and slice_config)")
    return cfg


def resampler_heads(embed_dim: int) -> int:
    """MiniCPM-V 2.6 builds its resampler with embed_dim // 128 heads."""
    heads = embed_dim // 128
    if heads < 1:
        raise LlmbuildError(f"config.json: hidden_size {embed_dim}: the resampler has hidden_size // 128 heads, "
                            "so hidden_size must be at least 128")
    return heads


def vit_geometry(cfg: dict[str, Any]) -> dict[str, int]:
    """The static vit net's sizes from config.json: patch, max_patches (the most a slice of
    slice_config.scale_resolution can have), the position table's side, query_num and the text width."""
    vc, sc = cfg["vision_config"], cfg["slice_config"]
    patch = int(vc.get("patch_size", 14))
    scale = int(sc.get("scale_resolution", 448))
    if scale % patch:
        raise LlmbuildError(f"config.json: slice_config.scale_resolution {scale} is not a multiple of the patch "
                            f"size {patch}")
    return {"patch": patch, "scale": scale, "max_patches": max_patches(scale, patch),
            "side": int(vc.get("image_size", 224)) // patch, "queries": int(cfg["query_num"]),
            "embed_dim": int(cfg["hidden_size"]), "max_slices": int(sc.get("max_slice_nums", 9))}


def runtime_meta(cfg: dict[str, Any], added: dict[str, int], tokenizer_path: Path,
                 net_shapes: dict[str, tuple[int, ...]] | None = None, vision: Any = None) -> dict[str, Any]:
    """What the runtime needs to slice an image and write its placeholders (the binary's meta.vision): the
    slicing sizes, the normalization, and the ids of MiniCPM-V's image tokens in the tokenizer (all from
    config.json and the tokenizer: the net's input shapes and the recipe's `vision` section add nothing)."""
    missing = [t for t in IMAGE_TOKENS if t not in added]
    if missing:
        raise LlmbuildError(f"{tokenizer_path}: no {missing[0]!r} token (a MiniCPM-V tokenizer has "
                            f"{', '.join(IMAGE_TOKENS)})")
    geo = vit_geometry(cfg)
    start, end, slice_start, slice_end, unk, id_start, id_end = (int(added[t]) for t in IMAGE_TOKENS)
    return {"patch_size": geo["patch"], "scale_resolution": geo["scale"], "max_slices": geo["max_slices"],
            "max_patches": geo["max_patches"], "position_side": geo["side"], "embed_dim": geo["embed_dim"],
            "mean": list(MEAN), "std": list(STD), "use_image_id": bool(cfg.get("use_image_id", True)),
            "image_start_id": start, "image_end_id": end, "slice_start_id": slice_start, "slice_end_id": slice_end,
            "image_token_id": unk, "image_id_start_id": id_start, "image_id_end_id": id_end}


VISION_FIELDS = ("vision_config", "slice_config", "query_num", "auto_map", "image_size", "patch_size", "slice_mode",
                 "use_image_id", "batch_vision_input", "drop_vision_last_layer", "vision_batch_size")


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config.json fields of a MiniCPM-V 2.6 config (its top level is the Qwen2
    model's); any other config as it is."""
    if cfg.get("model_type") != "minicpmv":
        return cfg
    return {**{k: v for k, v in cfg.items() if k not in VISION_FIELDS}, "model_type": "qwen2",
            "architectures": ["Qwen2ForCausalLM"]}

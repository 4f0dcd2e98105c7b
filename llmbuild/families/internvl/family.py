"""InternVL, described: which config.json is one (`HF_MODEL_TYPES`, either layout: config.py), its language
model's config, its image tokens and what the runtime needs to tile an image (the binary's meta.vision).
json only: shared phase packages reach it through the family registry (`family_part("internvl",
"family")`), and the folder's other modules build on it:

- `config.py`: config.json in InternVL's original `internvl_chat` layout read as the native one;
- `runtime.py`: dynamic tiling and the prompt's placeholders, for the runtime (Pillow, numpy);
- `model.py`: the checkpoint's tensors under the native names (`TensorView`, either layout), transformers'
  tower, pixel shuffle and projector as one module, its ONNX export (the vit net's source);
- `synthetic.py`: the tiny checkpoint's vision part, in transformers' native layout;
- `stream.py`: transformers' InternVL with an image, streamed one layer at a time (the reference);
- `verify.py`: the vision step's case and the image end-to-end check;
- `cost.py`: the tower's cost per tile for `llmbuild estimate`, and its size for the steps' resources.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError
from llmbuild.families.internvl.config import CHAT_MODEL_TYPE, native_config

# config.json model_type values of this family (its vision.family is "internvl"): transformers' native
# layout, and the original one its remote code saves.
HF_MODEL_TYPES = ("internvl", CHAT_MODEL_TYPE)
# None: the vendor's .bmodel is built (its `vit` net is the tower as the incumbent's converter gives it).
NO_VENDOR_EXPORT = None
# Where generation stops besides generation_config's eos_token_id: nowhere else.
CHAT_TERMINATORS: tuple[str, ...] = ()
# InternVL's image tokens: an image's start and end, and the rows the features fill.
IMAGE_TOKENS = ("<img>", "</img>", "<IMG_CONTEXT>")
# ImageNet's mean and deviation, which InternVL normalizes a tile with after a bicubic resize.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
# Where its checkpoints store the language model (the original layout; transformers' native one) -> the prefix
# of lm_head (frontend/hf.py reads every registered family's).
TEXT_PREFIXES = {"language_model.model.": "language_model.", "model.language_model.": ""}
# Fields a native config.json sets at the top level for its language model too.
TEXT_INHERITED = ("bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings", "torch_dtype")


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config.json fields: the native config's `text_config` (the original layout's
    `llm_config`, translated), with the token ids and tying it sets at the top level."""
    native = native_config(cfg)
    text = native.get("text_config")
    if not (isinstance(text, dict) and isinstance(native.get("vision_config"), dict)):
        return native
    return {**text, **{k: native[k] for k in TEXT_INHERITED if k in native and k not in text}}


def runtime_meta(cfg: dict[str, Any], added: dict[str, int], tokenizer_path: Path,
                 net_shapes: dict[str, tuple[int, ...]], vision: Any) -> dict[str, Any]:
    """What the runtime needs to tile an image and write its placeholders (the binary's meta.vision): the
    tile's size (the vit net's `pixel_values`), the normalization, the recipe's `vision.max_tiles`, and the
    ids of InternVL's image tokens (`image_token_id` as config.json says, else the tokenizer's)."""
    missing = [t for t in IMAGE_TOKENS if t not in added]
    if missing:
        raise LlmbuildError(f"{tokenizer_path}: no {missing[0]!r} token (an InternVL tokenizer has <img>, </img> "
                            "and <IMG_CONTEXT>)")
    start, end, context = IMAGE_TOKENS
    return {"image_size": int(net_shapes["pixel_values"][-1]), "mean": list(MEAN), "std": list(STD),
            "max_tiles": vision.max_tiles,  # dynamic tiling, with a thumbnail
            "use_thumbnail": True, "image_start_id": added[start], "image_end_id": added[end],
            "image_token_id": int(cfg.get("image_token_id", added[context]))}

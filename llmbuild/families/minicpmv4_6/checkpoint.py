"""A MiniCPM-V 4.6 directory's vision tensors checked at prepare, before the vision step exports them.

The language model's `model.language_model.*` tensors are checked by the ordinary scan (frontend/hf.py reads
them under their text names); this adds every `model.vision_tower.*` and `model.merger.*` tensor config.json
implies, with its shape, so a checkpoint missing one is refused in one line naming the file and the tensor
rather than half-way through the vision export. The shapes are worked out from the config here (no torch);
tests/test_minicpmv4_6.py holds them to transformers' own state dict.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError

_NORMS = ("weight", "bias")


def _linear(name: str, out: int, inp: int) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (out, inp), f"{name}.bias": (out,)}


def _attention(prefix: str, width: int) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        shapes |= _linear(f"{prefix}self_attn.{proj}", width, width)
    return shapes


def expected_vision_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tower and merger tensor of transformers' MiniCPMV4_6ForConditionalGeneration for a config."""
    vc = cfg["vision_config"]
    width, mlp = int(vc["hidden_size"]), int(vc["intermediate_size"])
    patch, channels = int(vc.get("patch_size", 14)), int(vc.get("num_channels", 3))
    side = int(vc.get("image_size", 224)) // patch
    embed = int(cfg["text_config"]["hidden_size"])
    tower, window = "model.vision_tower.", 4 * width
    shapes: dict[str, tuple[int, ...]] = {
        f"{tower}embeddings.patch_embedding.weight": (width, channels, patch, patch),
        f"{tower}embeddings.patch_embedding.bias": (width,),
        f"{tower}embeddings.position_embedding.weight": (side * side, width),
        **{f"{tower}post_layernorm.{k}": (width,) for k in _NORMS},
    }
    for i in range(int(vc["num_hidden_layers"])):
        layer = f"{tower}encoder.layers.{i}."
        shapes |= _attention(layer, width)
        shapes |= {f"{layer}{norm}.{k}": (width,) for norm in ("layer_norm1", "layer_norm2") for k in _NORMS}
        shapes |= _linear(f"{layer}mlp.fc1", mlp, width) | _linear(f"{layer}mlp.fc2", width, mlp)
    merger = f"{tower}vit_merger."
    shapes |= _attention(merger, width) | {f"{merger}layer_norm1.{k}": (width,) for k in _NORMS}
    shapes |= {f"{merger}pre_norm.{k}": (window,) for k in _NORMS}
    shapes |= _linear(f"{merger}linear_1", 4 * mlp, window) | _linear(f"{merger}linear_2", width, 4 * mlp)
    shapes |= {f"model.merger.mlp.0.pre_norm.{k}": (window,) for k in _NORMS}
    shapes |= _linear("model.merger.mlp.0.linear_1", window, window) | _linear("model.merger.mlp.0.linear_2",
                                                                                embed, window)
    return shapes


def check_vision_tensors(directory: Path, entries: Iterable[Any]) -> None:
    """`entries`: the checkpoint files' tensors (hf.HFSource.entries(): hf_name, shape, dtype, file)."""
    from llmbuild.families.minicpmv4_6.family import read_config
    from llmbuild.frontend.hf import INDEX_FILE, SINGLE_FILE

    directory = Path(directory)
    path = directory / "config.json"
    cfg = read_config(directory)
    try:
        expected = expected_vision_shapes(cfg)
    except (KeyError, TypeError, ValueError) as exc:
        raise LlmbuildError(f"{path}: vision_config: expected integer hidden_size, intermediate_size, "
                            f"num_hidden_layers (and patch_size, image_size), got {type(exc).__name__}: {exc}"
                            ) from None
    stored = {entry.hf_name: entry for entry in entries}
    listing = directory / INDEX_FILE if (directory / INDEX_FILE).is_file() else directory / SINGLE_FILE
    for name, shape in expected.items():
        entry = stored.get(name)
        if entry is None:
            raise LlmbuildError(f"{listing}: missing tensor {name!r} (config.json's vision_config needs it)")
        if tuple(entry.shape) != tuple(shape):
            raise LlmbuildError(f"{entry.file}: tensor {name!r} has shape {list(entry.shape)}, expected "
                                f"{list(shape)} from config.json")
        if not entry.dtype.startswith(("F", "BF")):
            raise LlmbuildError(f"{entry.file}: tensor {name!r} has dtype {entry.dtype}, expected a float type")

"""A MiniCPM-V 2.6 directory's vision tensors checked at prepare, before the vision step exports them.

The language model's `llm.*` tensors are checked by the ordinary scan (frontend/hf.py reads them under
their text names); this adds every `vpm.*` (SigLIP) and `resampler.*` tensor config.json implies, with its
shape, so a checkpoint missing one is refused in one line naming the file and the tensor rather than
half-way through the vision export. The shapes are worked out from the config here (no torch: prepare's
error stays one line, and quick); tests/test_minicpmv_hf.py holds them to the torch modules' state dicts.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError

_NORMS = ("weight", "bias")


def expected_vision_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every `vpm.*` and `resampler.*` tensor of model.build_modules for a MiniCPM-V config:
    transformers' Idefics2VisionTransformer under `vpm.`, the published resampler under `resampler.`."""
    vc = cfg["vision_config"]
    width, mlp = int(vc["hidden_size"]), int(vc["intermediate_size"])
    patch, channels = int(vc.get("patch_size", 14)), int(vc.get("num_channels", 3))
    side = int(vc.get("image_size", 224)) // patch
    embed, queries = int(cfg["hidden_size"]), int(cfg["query_num"])
    shapes: dict[str, tuple[int, ...]] = {
        "vpm.embeddings.patch_embedding.weight": (width, channels, patch, patch),
        "vpm.embeddings.patch_embedding.bias": (width,),
        "vpm.embeddings.position_embedding.weight": (side * side, width),
        **{f"vpm.post_layernorm.{k}": (width,) for k in _NORMS},
    }
    for i in range(int(vc["num_hidden_layers"])):
        layer = f"vpm.encoder.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes |= {f"{layer}self_attn.{proj}.weight": (width, width), f"{layer}self_attn.{proj}.bias": (width,)}
        shapes |= {f"{layer}{norm}.{k}": (width,) for norm in ("layer_norm1", "layer_norm2") for k in _NORMS}
        shapes |= {f"{layer}mlp.fc1.weight": (mlp, width), f"{layer}mlp.fc1.bias": (mlp,),
                   f"{layer}mlp.fc2.weight": (width, mlp), f"{layer}mlp.fc2.bias": (width,)}
    shapes |= {"resampler.query": (queries, embed), "resampler.kv_proj.weight": (embed, width),
               "resampler.attn.in_proj_weight": (3 * embed, embed), "resampler.attn.in_proj_bias": (3 * embed,),
               "resampler.attn.out_proj.weight": (embed, embed), "resampler.attn.out_proj.bias": (embed,),
               "resampler.proj": (embed, embed)}
    shapes |= {f"resampler.{norm}.{k}": (embed,) for norm in ("ln_q", "ln_kv", "ln_post") for k in _NORMS}
    return shapes


def check_vision_tensors(directory: Path, entries: Iterable[Any]) -> None:
    """`entries`: the checkpoint files' tensors (hf.HFSource.entries(): hf_name, shape, dtype, file)."""
    from llmbuild.families.minicpmv.family import read_config
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
            raise LlmbuildError(f"{listing}: missing tensor {name!r} (config.json's vision_config and "
                                "query_num need it)")
        if tuple(entry.shape) != tuple(shape):
            raise LlmbuildError(f"{entry.file}: tensor {name!r} has shape {list(entry.shape)}, expected "
                                f"{list(shape)} from config.json")
        if not entry.dtype.startswith(("F", "BF")):
            raise LlmbuildError(f"{entry.file}: tensor {name!r} has dtype {entry.dtype}, expected a float type")

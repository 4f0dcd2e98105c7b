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

from llmbuild.families import siglip


def expected_vision_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every `vpm.*` and `resampler.*` tensor of model.build_modules for a MiniCPM-V config:
    transformers' Idefics2VisionTransformer under `vpm.`, the published resampler under `resampler.`."""
    vc = cfg["vision_config"]
    width = int(vc["hidden_size"])
    embed, queries = int(cfg["hidden_size"]), int(cfg["query_num"])
    shapes = siglip.tower_shapes("vpm.", vc)
    shapes |= {"resampler.query": (queries, embed), "resampler.kv_proj.weight": (embed, width),
               "resampler.attn.in_proj_weight": (3 * embed, embed), "resampler.attn.in_proj_bias": (3 * embed,),
               "resampler.attn.out_proj.weight": (embed, embed), "resampler.attn.out_proj.bias": (embed,),
               "resampler.proj": (embed, embed)}
    shapes |= {f"resampler.{norm}.{k}": (embed,) for norm in ("ln_q", "ln_kv", "ln_post") for k in siglip.NORMS}
    return shapes


def check_vision_tensors(directory: Path, entries: Iterable[Any]) -> None:
    """`entries`: the checkpoint files' tensors (hf.HFSource.entries(): hf_name, shape, dtype, file)."""
    from llmbuild.families.minicpmv.family import read_config
    from llmbuild.frontend.hf import weights_listing

    directory = Path(directory)
    siglip.check_vision_tensors(directory, weights_listing(directory), read_config(directory), entries,
                                expected_vision_shapes,
                                "config.json's vision_config and query_num need it")

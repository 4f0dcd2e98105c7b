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

from llmbuild.families import siglip


def expected_vision_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tower and merger tensor of transformers' MiniCPMV4_6ForConditionalGeneration for a config."""
    vc = cfg["vision_config"]
    width, mlp = int(vc["hidden_size"]), int(vc["intermediate_size"])
    embed = int(cfg["text_config"]["hidden_size"])
    tower, window = "model.vision_tower.", 4 * width
    shapes = siglip.tower_shapes(tower, vc)
    merger = f"{tower}vit_merger."
    shapes |= siglip.attention_shapes(merger, width) | {f"{merger}layer_norm1.{k}": (width,) for k in siglip.NORMS}
    shapes |= {f"{merger}pre_norm.{k}": (window,) for k in siglip.NORMS}
    shapes |= siglip.linear_shapes(f"{merger}linear_1", 4 * mlp, window) | siglip.linear_shapes(
        f"{merger}linear_2", width, 4 * mlp)
    shapes |= {f"model.merger.mlp.0.pre_norm.{k}": (window,) for k in siglip.NORMS}
    shapes |= siglip.linear_shapes("model.merger.mlp.0.linear_1", window, window) | siglip.linear_shapes(
        "model.merger.mlp.0.linear_2", embed, window)
    return shapes


def check_vision_tensors(directory: Path, entries: Iterable[Any]) -> None:
    """`entries`: the checkpoint files' tensors (hf.HFSource.entries(): hf_name, shape, dtype, file)."""
    from llmbuild.families.minicpmv4_6.family import read_config
    from llmbuild.frontend.hf import weights_listing

    directory = Path(directory)
    siglip.check_vision_tensors(directory, weights_listing(directory), read_config(directory), entries,
                                expected_vision_shapes,
                                "config.json's vision_config needs it")

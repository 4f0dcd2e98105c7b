"""The inputs the vision step checks the vit net on, with the independent reference's output for each.

InternVL: one pseudo-random tile through transformers' own `get_image_features`. A family folder with a
`verify` module gives its own cases (MiniCPM-V: pieces of several patch grids, fed padded as the runtime
feeds them, against its reference at each piece's own size).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmbuild.families.registry import family_part_if_any
from llmbuild.importer.onnx_net import MASK_INPUT

CHECK_SEED = 20261202
Case = tuple[str, dict[str, np.ndarray], np.ndarray]  # (name, the net's inputs, the reference's features)


def vision_inputs(program_inputs: dict[str, tuple[int, ...]], pixels: np.ndarray) -> dict[str, np.ndarray]:
    """The vit net's inputs for one InternVL tile: the pixels, and a zero mask where the net has one
    (InternViT attends to every patch)."""
    inputs = {"pixel_values": pixels}
    if MASK_INPUT in program_inputs:
        inputs[MASK_INPUT] = np.zeros(program_inputs[MASK_INPUT], np.float32)
    return inputs


def check_cases(family: str, vlm: Path, shapes: dict[str, tuple[int, ...]]) -> list[Case]:
    own = family_part_if_any(family, "verify")
    if own is not None:  # a family with its own cases (MiniCPM-V: pieces of several grids)
        return own.vision_cases(vlm, CHECK_SEED)
    import torch

    from llmbuild.verify.stream_vlm import streamed_vision_module

    pixels = np.random.default_rng(CHECK_SEED).standard_normal(shapes["pixel_values"]).astype(np.float32)
    module, _ = streamed_vision_module(vlm)  # transformers' tower, its layers made one at a time
    with torch.no_grad():
        want = module(torch.from_numpy(pixels)).numpy()
    return [("tile", vision_inputs(shapes, pixels), want)]

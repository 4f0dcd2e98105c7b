"""The inputs the vision step checks the vit net on, with the independent reference's output for each.

InternVL: one pseudo-random tile through transformers' own `get_image_features`. MiniCPM-V: pieces of
several patch grids (one patch, a square, a wide and a tall one, the largest the net holds), each fed as
the runtime feeds it (padded, with the host-computed position ids, masks and sin-cos table), against the
reference at the piece's own size (frontend/minicpmv.reference_features: transformers' tower computes its
positions itself, no padding), so one check covers the padding, the masks and every input the host makes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

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
    if family == "minicpmv":
        return minicpmv_cases(vlm)
    import torch

    from llmbuild.verify.stream_vlm import streamed_vision_module

    pixels = np.random.default_rng(CHECK_SEED).standard_normal(shapes["pixel_values"]).astype(np.float32)
    module, _ = streamed_vision_module(vlm)  # transformers' tower, its layers made one at a time
    with torch.no_grad():
        want = module(torch.from_numpy(pixels)).numpy()
    return [("tile", vision_inputs(shapes, pixels), want)]


def minicpmv_grids(capacity: int, scale_side: int) -> list[tuple[int, int]]:
    """(rows, columns) patch grids to check: one patch, the slice's square, a wide and a tall one, and the
    most patches the net holds (its `capacity`)."""
    wide = (max(1, scale_side - 1), scale_side + 1)
    tall = (wide[1], wide[0])
    most = next((h, capacity // h) for h in range(int(capacity**0.5), 0, -1) if capacity % h == 0)
    grids = [(1, 1), (scale_side, scale_side), wide, tall, most]
    return [g for i, g in enumerate(grids) if g[0] * g[1] <= capacity and g not in grids[:i]]


def minicpmv_cases(vlm: Path) -> list[Case]:
    from llmbuild.frontend.minicpmv import load_vision, reference_features, vit_geometry
    from llmbuild.numerics.minicpmv_inputs import slice_inputs

    tower, resampler, cfg = load_vision(vlm)
    geo = vit_geometry(cfg)
    p = geo["patch"]
    rng = np.random.default_rng(CHECK_SEED)
    cases = []
    for h, w in minicpmv_grids(geo["max_patches"], geo["scale"] // p):
        piece = rng.standard_normal((3, h * p, w * p)).astype(np.float32)
        inputs = slice_inputs(piece, p, geo["max_patches"], geo["side"], geo["queries"], geo["embed_dim"])
        cases.append((f"{w}x{h} patches", inputs, reference_features(tower, resampler, piece)[None]))
    return cases

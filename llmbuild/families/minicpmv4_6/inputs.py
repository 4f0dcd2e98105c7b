"""The inputs of MiniCPM-V 4.6's static vit net for one piece of an image, in numpy.

One static graph serves pieces of any patch grid up to the net's capacity. What the model computes from a
piece's (h, w) grid is computed here: the tower's position ids (the nearest bucket of the position table), the
padding masks, and the order of the patches. The patches are fed in the order both 2x2 merges read them:
4x4 blocks row by row, inside a block its four 2x2 windows row by row, inside a window its four patches row by
row. Attention does not depend on the order of its rows (given the positions and masks in the same order), so
the window merger's windows are then groups of four consecutive rows (a block-diagonal mask, a reshape), its
output is the downsampled grid in 2x2-window order, and the merger's windows are again four consecutive rows:
the net is reshapes, products and masked attention, and its rows come out in transformers' row-major order of
the merged grid. The runtime fills these per piece (runtime.py) and the export traces the graph with them
(model.py), so both use this one definition.
"""

from __future__ import annotations

import math

import numpy as np

from llmbuild import LlmbuildError

MEAN = STD = (0.5, 0.5, 0.5)  # the image processor's IMAGENET_STANDARD mean and deviation
MASKED = -1.0e9  # an additive mask's value for a padding key: exp() of it is 0 in f32 and bf16
BLOCK = 4  # patches per side of one output row: two 2x2 merges
INPUTS = ("pixel_values", "position_ids", "attention_mask", "window_mask", "merged_mask")


def ensure_divide(length: float, divisor: int) -> int:
    return max(round(length / divisor) * divisor, divisor)


def best_resize(size: tuple[float, float], scale: int, patch: int, allow_upscale: bool = False) -> tuple[int, int]:
    """(height, width) of a piece as the image processor's find_best_resize gives it ("16x": each side a
    multiple of 4 patches)."""
    height, width = size
    if height * width > scale * scale or allow_upscale:
        ratio = width / height
        height = int(scale / math.sqrt(ratio))
        width = int(height * ratio)
    return ensure_divide(height, patch * BLOCK), ensure_divide(width, patch * BLOCK)


def capacity(scale: int, patch: int) -> int:
    """The most patches a piece can have for aspect ratios from 1:(scale/patch)² to (scale/patch)²:1: the vit
    net's static size (rounding each side to 4 patches can give more than (scale/patch)²)."""
    side = scale / patch
    best = BLOCK * BLOCK
    for ratio in np.exp(np.linspace(-2 * math.log(side), 2 * math.log(side), 20001)):
        h, w = best_resize((1000.0, 1000.0 * float(ratio)), scale, patch, allow_upscale=True)
        best = max(best, (h // patch) * (w // patch))
    return best


def merge_order(grid_h: int, grid_w: int) -> np.ndarray:
    """The row-major patch index of each fed row: 4x4 blocks, their 2x2 windows, the windows' patches."""
    by, bx, wy, wx, py, px = np.meshgrid(np.arange(grid_h // BLOCK), np.arange(grid_w // BLOCK), np.arange(2),
                                         np.arange(2), np.arange(2), np.arange(2), indexing="ij")
    return ((BLOCK * by + 2 * wy + py) * grid_w + BLOCK * bx + 2 * wx + px).reshape(-1)


def position_ids(grid_h: int, grid_w: int, side: int) -> np.ndarray:
    """The position-table row of each patch, row-major: transformers' get_vision_nearest_position_ids (the
    fractional coordinate i/h bucketized onto the side x side table), in float32 as torch computes it."""
    # The boundaries as torch.arange(1/side, 1.0, 1/side) makes them: start + i * step in float64, then float32.
    step = 1.0 / side
    count = math.ceil((1.0 - step) / step)
    boundaries = (step + np.arange(count, dtype=np.float64) * step).astype(np.float32)
    rows = np.arange(grid_h, dtype=np.float32) / np.float32(grid_h)
    cols = np.arange(grid_w, dtype=np.float32) / np.float32(grid_w)
    bucket_h = np.searchsorted(boundaries, rows, side="right")
    bucket_w = np.searchsorted(boundaries, cols, side="right")
    return (bucket_h[:, None] * side + bucket_w[None, :]).reshape(-1).astype(np.int64)


def _padding_mask(valid: int, size: int) -> np.ndarray:
    keys = np.where(np.arange(size) < valid, 0.0, MASKED).astype(np.float32)
    return np.broadcast_to(keys, (1, 1, size, size)).copy()


def slice_inputs(piece: np.ndarray, patch: int, cap: int, side: int, where: str = "image") -> dict[str, np.ndarray]:
    """The vit net's inputs for one piece [3, h*patch, w*patch] (h, w multiples of 4), padded to `cap`
    patches: the pixels patch by patch in merge order ([1, 3, patch, cap*patch]), their position ids, the
    encoder's padding mask, the window merger's block-diagonal mask and the merged rows' padding mask."""
    _, height, width = piece.shape
    grid_h, grid_w = height // patch, width // patch
    n = grid_h * grid_w
    if grid_h % BLOCK or grid_w % BLOCK or (grid_h * patch, grid_w * patch) != (height, width):
        raise LlmbuildError(f"{where}: a piece of {width}x{height} pixels: expected sides that are multiples of "
                            f"{BLOCK * patch} (4 patches of {patch})")
    if n > cap:
        raise LlmbuildError(f"{where}: a slice of {grid_w}x{grid_h} patches is more than the vit net's {cap} "
                            "(an aspect ratio this extreme is not supported)")
    order = merge_order(grid_h, grid_w)
    patches = piece.reshape(3, grid_h, patch, grid_w, patch).transpose(0, 2, 1, 3, 4).reshape(3, patch, n, patch)
    pixels = np.zeros((1, 3, patch, cap * patch), np.float32)
    pixels[0, :, :, : n * patch] = patches[:, :, order].reshape(3, patch, n * patch)
    ids = np.zeros((1, cap), np.int64)
    ids[0, :n] = position_ids(grid_h, grid_w, side)[order]
    group = np.arange(cap) // 4
    window = np.where(group[:, None] == group[None, :], 0.0, MASKED).astype(np.float32)[None, None]
    return {"pixel_values": pixels, "position_ids": ids, "attention_mask": _padding_mask(n, cap),
            "window_mask": window, "merged_mask": _padding_mask(n // 4, cap // 4)}


def rows_of(piece: np.ndarray, patch: int) -> int:
    """How many of the net's output rows a piece fills: h*w/16."""
    return (piece.shape[1] // patch) * (piece.shape[2] // patch) // (BLOCK * BLOCK)

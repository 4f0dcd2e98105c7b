"""The inputs of MiniCPM-V's static vit net for one piece of an image, in numpy.

One static graph serves pieces of any grid up to `max_patches`: what MiniCPM-V computes from a piece's (h, w)
patch grid (the tower's position ids, its padding mask, the resampler's key mask and sin-cos table) is
computed here on the host and fed in. The runtime fills them per piece (runtime.py) and the
export traces the graph with them (model.py), so both use this one definition. The vendor's `.bmodel` takes
the same piece in the form LLM-TPU's runtime feeds it (`vendor_inputs`: patch rows, and ids into a sin-cos
table the net holds instead of the table's rows).
"""

from __future__ import annotations

import math

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.numerics.sincos import sincos_2d

MEAN = STD = (0.5, 0.5, 0.5)  # MiniCPM-V's normalization of every piece
MASKED = -1.0e9  # an additive mask's value for a padding key: exp() of it is 0 in f32 and bf16
# The inputs of the bmodel's vit net, in order: the names and order of `llm_convert`'s MiniCPM-V vit net
# (TPU-MLIR's MiniCPMV4Converter), which LLM-TPU's MiniCPM-V runtime fills by position.
VENDOR_INPUTS = ("input_states", "pos_ids", "attn_mask", "pos_embed_ids", "resampler_attn_mask")


def ensure_divide(length: float, patch: int) -> int:
    return max(round(length / patch) * patch, patch)


def best_resize(size: tuple[float, float], scale: int, patch: int, allow_upscale: bool = False) -> tuple[int, int]:
    """(width, height) of a piece: about scale² pixels at the image's aspect ratio when it is larger (or
    when upscaling is allowed), each side rounded to a multiple of `patch`."""
    width, height = size
    if width * height > scale * scale or allow_upscale:
        ratio = width / height
        height = int(scale / math.sqrt(ratio))
        width = int(height * ratio)
    return ensure_divide(width, patch), ensure_divide(height, patch)


def max_patches(scale: int, patch: int) -> int:
    """The most patches a piece of MiniCPM-V's slicing can have for aspect ratios from 1:(scale/patch)² to
    (scale/patch)²:1 (both sides at least one patch before rounding): the vit net's static size. Rounding
    each side to the nearest multiple of the patch can give a few more than (scale/patch)²."""
    side = scale / patch
    best = 1
    for ratio in np.exp(np.linspace(-2 * math.log(side), 2 * math.log(side), 20001)):
        w, h = best_resize((1000.0 * float(ratio), 1000.0), scale, patch, allow_upscale=True)
        best = max(best, (w // patch) * (h // patch))
    return best


def position_ids(grid_h: int, grid_w: int, side: int) -> np.ndarray:
    """The tower's position of each patch, row by row: its fractional coordinates bucketized onto the
    side x side grid of the position table (NaViT, as SigLIP in MiniCPM-V and transformers' Idefics2 do)."""
    # The table's bucket boundaries as torch.arange(1/side, 1.0, 1/side) makes them: start + i * step in
    # float64, then float32. numpy's float32 arange steps in float32 and gives 19 of the 69 boundaries of
    # MiniCPM-V's 70-wide table one ulp apart, which moved a patch of 7 side lengths (10, 20, 35, 40, 42, 50
    # and 70 patches) to the neighbouring bucket.
    step = 1.0 / side
    count = math.ceil((1.0 - step) / step)
    boundaries = (step + np.arange(count, dtype=np.float64) * step).astype(np.float32)
    rows = np.clip(np.arange(grid_h, dtype=np.float32) * np.float32(1.0 / grid_h), None, np.float32(1 - 1e-6))
    cols = np.clip(np.arange(grid_w, dtype=np.float32) * np.float32(1.0 / grid_w), None, np.float32(1 - 1e-6))
    bucket_h = np.searchsorted(boundaries, rows, side="right")
    bucket_w = np.searchsorted(boundaries, cols, side="right")
    return (bucket_h[:, None] * side + bucket_w[None, :]).reshape(-1).astype(np.int64)


def slice_inputs(piece: np.ndarray, patch: int, capacity: int, side: int, queries: int, embed_dim: int,
                 where: str = "image") -> dict[str, np.ndarray]:
    """The vit net's inputs for one piece [3, h*patch, w*patch], padded to `capacity` patches: the pixels
    patch by patch ([1, 3, patch, capacity*patch]), the position ids, the tower's and the resampler's
    additive masks (padding keys masked) and the resampler keys' sin-cos table of the (h, w) grid."""
    _, height, width = piece.shape
    grid_h, grid_w = height // patch, width // patch
    n = grid_h * grid_w
    if n > capacity:
        raise LlmbuildError(f"{where}: a slice of {grid_w}x{grid_h} patches is more than the vit net's "
                            f"{capacity} (an aspect ratio this extreme is not supported)")
    patches = piece.reshape(3, grid_h, patch, grid_w, patch).transpose(0, 2, 1, 3, 4).reshape(3, patch, n * patch)
    pixels = np.zeros((1, 3, patch, capacity * patch), np.float32)
    pixels[0, :, :, : n * patch] = patches
    ids = np.zeros((1, capacity), np.int64)
    ids[0, :n] = position_ids(grid_h, grid_w, side)
    pos = np.zeros((1, capacity, embed_dim), np.float32)
    pos[0, :n] = sincos_2d(embed_dim, grid_h, grid_w).reshape(n, embed_dim)
    tower_mask, resampler_mask = key_masks(n, capacity, queries)
    return {"pixel_values": pixels, "position_ids": ids, "attention_mask": tower_mask,
            "resampler_mask": resampler_mask, "pos_embed": pos}


def key_masks(n: int, capacity: int, queries: int) -> tuple[np.ndarray, np.ndarray]:
    """The tower's [1, 1, capacity, capacity] and the resampler's [1, 1, queries, capacity] additive masks of
    a piece of `n` patches: the padding keys masked."""
    keys = np.where(np.arange(capacity) < n, 0.0, MASKED).astype(np.float32)
    return (np.broadcast_to(keys, (1, 1, capacity, capacity)).copy(),
            np.broadcast_to(keys, (1, 1, queries, capacity)).copy())


def vendor_inputs(piece: np.ndarray, patch: int, capacity: int, side: int, queries: int,
                  where: str = "image") -> list[np.ndarray]:
    """The bmodel's vit net's inputs for one piece [3, h*patch, w*patch], in its order (`VENDOR_INPUTS`), as
    LLM-TPU's MiniCPM-V runtime fills them: the patches one row each ([capacity, 3*patch*patch], channel, row,
    column within a patch), the tower's position ids, its mask, each patch's row * side + column in the
    resampler's side x side sin-cos table, and the resampler's mask; padded to `capacity` patches."""
    _, height, width = piece.shape
    grid_h, grid_w = height // patch, width // patch
    n = grid_h * grid_w
    if n > capacity:
        raise LlmbuildError(f"{where}: a slice of {grid_w}x{grid_h} patches is more than the vit net's "
                            f"{capacity} (an aspect ratio this extreme is not supported)")
    if grid_h > side or grid_w > side:
        raise LlmbuildError(f"{where}: a piece of {grid_w}x{grid_h} patches: the bmodel's vit net takes pieces of "
                            f"at most {side} patches a side (the resampler's {side}x{side} position table, as "
                            "the vendor's runtime addresses it); the .llmb takes it")
    rows = np.zeros((capacity, 3 * patch * patch), np.float32)
    rows[:n] = piece.reshape(3, grid_h, patch, grid_w, patch).transpose(1, 3, 0, 2, 4).reshape(n, -1)
    ids = np.zeros(capacity, np.int32)
    ids[:n] = position_ids(grid_h, grid_w, side)
    table_rows = np.zeros(capacity, np.int32)
    table_rows[:n] = (np.arange(grid_h)[:, None] * side + np.arange(grid_w)[None, :]).reshape(-1)
    tower_mask, resampler_mask = key_masks(n, capacity, queries)
    return [rows, ids, tower_mask, table_rows, resampler_mask]

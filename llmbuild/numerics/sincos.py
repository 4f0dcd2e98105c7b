"""The fixed 2-D sin-cos position table of MiniCPM-V's resampler keys, in numpy: the host computes it per
slice grid and feeds it to the static vit net (families/minicpmv/runtime.py), and the torch reference adds
the same table (families/minicpmv/model.py), so both sides share this one definition."""

from __future__ import annotations

import numpy as np


def sincos_1d(dim: int, pos: np.ndarray) -> np.ndarray:
    """[*pos.shape, dim]: sin of pos·ω then cos of pos·ω, ω = 10000^(-2i/dim) (float32, as published)."""
    omega = np.arange(dim // 2, dtype=np.float32) / (dim / 2.0)
    omega = 1.0 / 10000**omega
    out = np.einsum("hw,d->hwd", pos.astype(np.float32), omega.astype(np.float32))
    return np.concatenate([np.sin(out), np.cos(out)], axis=-1)


def sincos_2d(dim: int, height: int, width: int) -> np.ndarray:
    """[height, width, dim] 2-D sin-cos embedding of a patch grid: the first half from the column index, the
    second from the row index (the published `get_2d_sincos_pos_embed`, whose meshgrid puts w first)."""
    grid_w, grid_h = np.meshgrid(np.arange(width, dtype=np.float32), np.arange(height, dtype=np.float32))
    return np.concatenate([sincos_1d(dim // 2, grid_w), sincos_1d(dim // 2, grid_h)], axis=-1).astype(np.float32)

"""Position ids and additive attention masks for the three stage signatures (see docs/design.md).

All shapes are static: a call with fewer real tokens than the net's width is padded, and the mask hides
what is not real. Padded rows still get valid (clipped) positions so the RoPE gather stays in range.
"""

from __future__ import annotations

import numpy as np

from llmbuild.numerics.formats import mask_value


def prefill(n: int, L: int, S: int) -> tuple[np.ndarray, np.ndarray]:
    """First chunk: n real tokens at positions 0..n-1. mask [1,1,L,L], causal."""
    pos = np.minimum(np.arange(L), S - 1).reshape(1, L).astype(np.int32)
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    mask = np.where(j <= i, np.float32(0), np.float32(mask_value("")))
    return pos, mask.reshape(1, 1, L, L)


def prefill_kv(n: int, history: int, L: int, S: int) -> tuple[np.ndarray, np.ndarray]:
    """n new tokens after `history` cached rows. Keys: the S cache rows, then the L new rows."""
    pos = np.minimum(history + np.arange(L), S - 1).reshape(1, L).astype(np.int32)
    i = np.arange(L)[:, None]
    cache_cols = np.broadcast_to(np.arange(S)[None, :] < history, (L, S))
    new_cols = np.arange(L)[None, :] <= i
    visible = np.concatenate([cache_cols, new_cols], axis=1)
    mask = np.where(visible, np.float32(0), np.float32(mask_value("")))
    return pos, mask.reshape(1, 1, L, S + L)


def decode(history: int, S: int) -> tuple[np.ndarray, np.ndarray]:
    """One token at position `history`: keys are the S cache rows (first `history` real), then itself."""
    pos = np.array([[min(history, S - 1)]], dtype=np.int32)
    visible = np.concatenate([np.arange(S) < history, [True]])
    mask = np.where(visible, 0.0, mask_value("")).astype(np.float32)
    return pos, mask.reshape(1, 1, 1, S + 1)

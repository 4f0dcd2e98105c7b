"""The canonical quantized linear layer every checkpoint format is read into.

One layout for all formats, `[out_features N, in_features K]` like the float checkpoints (the compiler
keeps the checkpoint's `[out, in]` layout, see docs/design.md), with integer levels unpacked to one
uint8 each: readers only unpack and re-index, so a layer read from any format dequantizes exactly as the
library that wrote it does, and the device packer (`pack.py`) has a single input to handle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmbuild import LlmbuildError

SUPPORTED_BITS = (4, 8)


@dataclass(frozen=True, eq=False)
class QuantizedLinear:
    """W[n, k] = (q[n, k] - zero[n, g_idx[k]]) * scale[n, g_idx[k]], g_idx[k] = k // group_size if absent.

    q: uint8 [N, K] integer levels in [0, 2**bits).
    scale: float32 [N, K/g] (per channel: [N, 1], group_size == K).
    zero: float32 [N, K/g] zero points in level units (integers for every format read here; float so a
        format with fractional zero points would still fit).
    g_idx: int32 [K] or None. Act order: input row k belongs to group g_idx[k], not k // g.
    bias: float32 [N] or None.
    """

    q: np.ndarray
    scale: np.ndarray
    zero: np.ndarray
    group_size: int
    bits: int
    g_idx: np.ndarray | None = None
    bias: np.ndarray | None = None

    def __post_init__(self) -> None:
        # Checked here once so every consumer can index without bounds worries.
        if self.bits not in SUPPORTED_BITS:
            raise LlmbuildError(f"QuantizedLinear: unsupported bits {self.bits}, expected one of {SUPPORTED_BITS}")
        if self.q.dtype != np.uint8 or self.q.ndim != 2:
            raise LlmbuildError(f"QuantizedLinear: q must be uint8 [N, K], got {self.q.dtype} {list(self.q.shape)}")
        n, k = self.q.shape
        if self.group_size <= 0 or k % self.group_size:
            raise LlmbuildError(f"QuantizedLinear: group_size {self.group_size} does not divide in_features {k}")
        groups = k // self.group_size
        for name, arr in (("scale", self.scale), ("zero", self.zero)):
            if arr.shape != (n, groups):
                raise LlmbuildError(f"QuantizedLinear: {name} has shape {list(arr.shape)}, expected {[n, groups]}")
        if self.g_idx is not None and (
            self.g_idx.shape != (k,) or self.g_idx.min(initial=0) < 0 or self.g_idx.max(initial=0) >= groups
        ):
            raise LlmbuildError(f"QuantizedLinear: g_idx must be [{k}] with values in [0, {groups})")
        if self.bias is not None and self.bias.shape != (n,):
            raise LlmbuildError(f"QuantizedLinear: bias has shape {list(self.bias.shape)}, expected {[n]}")
        if int(self.q.max(initial=0)) >= 1 << self.bits:
            raise LlmbuildError(f"QuantizedLinear: q has a level above {(1 << self.bits) - 1} for {self.bits} bits")

    @property
    def out_features(self) -> int:
        return int(self.q.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.q.shape[1])

    @property
    def num_groups(self) -> int:
        return self.in_features // self.group_size

    def group_index(self) -> np.ndarray:
        """int32 [K]: the group of each input row (g_idx, or k // group_size)."""
        if self.g_idx is not None:
            return self.g_idx.astype(np.int32)
        return (np.arange(self.in_features) // self.group_size).astype(np.int32)

    def dequantize(self) -> np.ndarray:
        """float32 [N, K]. (q - zero) is an exact small integer, so each element is one f32 multiply."""
        gi = self.group_index()
        levels = self.q.astype(np.float32) - self.zero.astype(np.float32)[:, gi]
        return levels * self.scale.astype(np.float32)[:, gi]

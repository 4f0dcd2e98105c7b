"""The device's weight layout for A16MatMul (the incumbent's format), and back.

- weight: 4-bit levels two per uint8 along K, even k in the low nibble: uint8 [N, K/2]; 8-bit: uint8 [N, K].
- scale: float32 [N, K/g]; zp: uint8 [N, K/g] (zero points in level units).
The device computes x · ((w − zp) · scale)ᵀ with contiguous groups only: group j is inputs j·g … j·g+g−1.

Act-order checkpoints (g_idx not k // g) are made device-legal without re-quantizing: sort the input rows
by group (a stable argsort of g_idx), so every group becomes contiguous, and hand the permutation to the
compiler, which gathers the activations with it: x · Wᵀ = x[..., perm] · W[:, perm]ᵀ exactly, since every
weight element keeps its level, scale and zero point.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.quant.linear import QuantizedLinear


@dataclass(frozen=True, eq=False)
class DeviceQuantWeights:
    weight: np.ndarray  # uint8 [N, K/2] (4-bit) or [N, K] (8-bit)
    scale: np.ndarray  # float32 [N, K/g]
    zp: np.ndarray  # uint8 [N, K/g]
    bits: int
    group_size: int
    in_features: int
    perm: np.ndarray | None = None  # int32 [K]: device input j is checkpoint input perm[j]; None = identity
    bias: np.ndarray | None = None  # float32 [N]

    def permute_activations(self, x: np.ndarray) -> np.ndarray:
        """What the compiler inserts before the matmul: gather the last axis with `perm`."""
        return x if self.perm is None else x[..., self.perm]


def act_order_permutation(ql: QuantizedLinear) -> np.ndarray | None:
    """The stable sort of input rows by group that makes groups contiguous; None when they already are."""
    if ql.g_idx is None:
        return None
    g_idx = ql.g_idx.astype(np.int64)
    if np.array_equal(g_idx, np.arange(ql.in_features) // ql.group_size):
        return None
    counts = np.bincount(g_idx, minlength=ql.num_groups)
    if np.any(counts != ql.group_size):
        # After sorting, group j must fill exactly inputs j*g .. j*g+g-1 for the device's k // g indexing.
        bad = int(np.flatnonzero(counts != ql.group_size)[0])
        raise LlmbuildError(
            f"g_idx: group {bad} has {int(counts[bad])} input rows, expected {ql.group_size}; "
            "groups of unequal size cannot be made contiguous"
        )
    return np.argsort(g_idx, kind="stable").astype(np.int32)


def device_zero_points(zero: np.ndarray, bits: int, what: str) -> np.ndarray:
    """Zero points as the device's uint8 zp; LlmbuildError (`what`: who asks) unless integers in range."""
    zero = np.asarray(zero, dtype=np.float32)
    top = (1 << bits) - 1
    if np.any(zero != np.round(zero)) or zero.min(initial=0) < 0 or zero.max(initial=0) > top:
        raise LlmbuildError(f"{what}: zero points must be integers in [0, {top}] for the device's uint8 zp")
    return zero.astype(np.uint8)


def pack_levels(q: np.ndarray, bits: int, what: str) -> np.ndarray:
    """[N, K] levels -> the device's bytes: 4-bit two to a byte, even k in the low nibble, odd k in the high
    one; 8-bit as they are (the inverse of numerics.dequantize.unpack_nibbles)."""
    if bits == 4 and q.shape[-1] % 2:
        raise LlmbuildError(f"{what}: 4-bit needs an even in_features, got {q.shape[-1]}")
    if bits != 4:
        return np.array(q, dtype=np.uint8, order="C")
    if sys.byteorder == "little" and q.dtype == np.uint8 and q.ndim == 2:
        # Each pair of levels read as one little-endian uint16 (even k its low byte): its byte is
        # lo | (hi << 4), three contiguous passes instead of two strided reads (a 7B's largest projection
        # packed in 37 against 159 ms; every read of a quantized layer packs its seven).
        pairs = np.ascontiguousarray(q).view(np.uint16)
        packed = pairs >> np.uint16(4)
        packed &= np.uint16(0xF0)
        packed |= pairs
        return packed.astype(np.uint8)
    return np.ascontiguousarray(q[:, 0::2] | (q[:, 1::2] << 4), dtype=np.uint8)


def pack(ql: QuantizedLinear) -> DeviceQuantWeights:
    """QuantizedLinear -> device layout (permuting K for act order; no level, scale or zero changes)."""
    zp = device_zero_points(ql.zero, ql.bits, "pack")
    perm = act_order_permutation(ql)
    q = ql.q if perm is None else ql.q[:, perm]
    return DeviceQuantWeights(
        weight=pack_levels(q, ql.bits, "pack"),
        scale=np.asarray(ql.scale, dtype=np.float32).copy(),
        zp=zp,
        bits=ql.bits,
        group_size=ql.group_size,
        in_features=ql.in_features,
        perm=perm,
        bias=None if ql.bias is None else np.asarray(ql.bias, dtype=np.float32).copy(),
    )


def unpack(dw: DeviceQuantWeights) -> QuantizedLinear:
    """Device layout -> QuantizedLinear in the device's (permuted) input order, g_idx None.

    Its dequantize() is the original weight with columns gathered by `dw.perm`."""
    n = dw.weight.shape[0]
    if dw.bits == 4:
        expected = (n, dw.in_features // 2)
        if dw.weight.shape != expected:
            raise LlmbuildError(f"unpack: weight has shape {list(dw.weight.shape)}, expected {list(expected)}")
        q = np.empty((n, dw.in_features), dtype=np.uint8)
        q[:, 0::2] = dw.weight & 0xF
        q[:, 1::2] = dw.weight >> 4
    else:
        if dw.weight.shape != (n, dw.in_features):
            raise LlmbuildError(f"unpack: weight has shape {list(dw.weight.shape)}, expected {[n, dw.in_features]}")
        q = dw.weight.copy()
    return QuantizedLinear(
        q=q,
        scale=dw.scale.copy(),
        zero=dw.zp.astype(np.float32),
        group_size=dw.group_size,
        bits=dw.bits,
        bias=None if dw.bias is None else dw.bias.copy(),
    )

"""Dequantizing A16MatMul's weights: 4- or 8-bit levels in groups along K, a scale and a zero point per group,
rounded to `dequant_dtype` as the device's dequantizer does (op_defs/a16_matmul.py is the specification).

A whole weight dequantized once and cached (`dequantize`, the build's checks); one dequantized without the
cache for a caller that keeps it (`dequantize_uncached`, the host path's cache, the vendor export); a weight
left in its storage format and dequantized a block of rows at a time as a product reads it
(`DequantizedRows`, numerics/weight_product.py). Large 4-bit weights go through the compiled dequantizer
(compiled_dequant.py), with the same bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.numerics import buffer_pool, compiled_dequant, levels_product
from llmbuild.numerics.formats import CACHE_BLOCK, compute_dtype, round_bf16_inplace, round_to
from llmbuild.numerics.stored import RowReader, StoredTensor, Weight, row_slice

# A byte's two levels as a little-endian uint16: the low nibble in the first byte, the high in the second.
_NIBBLE_PAIRS = ((np.arange(256) & 0xF) | ((np.arange(256) >> 4) << 8)).astype("<u2")


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """[N, K/2] bytes -> [N, K] 4-bit levels, even k from the low nibble (one table lookup per byte: half the
    time of two strided writes)."""
    b = np.ascontiguousarray(packed, dtype=np.uint8)
    return _NIBBLE_PAIRS[b].view(np.uint8).reshape(b.shape[0], b.shape[1] * 2)


# Runtimes hand the same (cached, read-only) weight arrays to every call: dequantize each weight once.
# Keyed by the arrays' identities, holding them so the ids stay valid; bounded, oldest out first.
_DEQUANT_CACHE: dict[tuple, tuple[tuple[np.ndarray, ...], np.ndarray]] = {}
_DEQUANT_CACHE_SIZE = 512


def dequantize(attrs: dict[str, Any], weight: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    key = (id(weight), id(scale), id(zp), attrs.get("packed"), attrs["q_group_size"], attrs.get("dequant_dtype"))
    hit = _DEQUANT_CACHE.get(key)
    if hit is not None and hit[0][0] is weight and hit[0][1] is scale and hit[0][2] is zp:
        return hit[1]
    w = dequantize_values(attrs, weight, scale, zp)
    if not (weight.flags.writeable or scale.flags.writeable or zp.flags.writeable):
        if len(_DEQUANT_CACHE) >= _DEQUANT_CACHE_SIZE:
            _DEQUANT_CACHE.pop(next(iter(_DEQUANT_CACHE)))
        _DEQUANT_CACHE[key] = ((weight, scale, zp), w)
    return w


def dequantize_uncached(attrs: dict[str, Any], weight: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    """`dequantize` for a caller that keeps the result itself (the host path's bounded cache)."""
    return dequantize_values(attrs, weight, scale, zp)


def clear_dequantize_cache() -> None:
    """Forget every cached dequantized weight (a build step done with one layer's weights): nothing may read
    an array `dequantize` returned after this; their memory goes to the next layer's (buffer_pool.py)."""
    buffer_pool.give_back(w for _, w in _DEQUANT_CACHE.values())
    _DEQUANT_CACHE.clear()


def dequantize_values(attrs: dict[str, Any], weight: np.ndarray, scale: np.ndarray, zp: np.ndarray,
                into: np.ndarray | None = None, compiled: bool | None = None) -> np.ndarray:
    """(levels - zero) * scale per group of K, in the scale's type; with `dequant_dtype`, rounded to it as
    the device's dequantizer does. Into one array, in row blocks that stay in the L2 cache (twice as fast
    as whole-matrix passes: a 7B projection is 68M values). `into`: a buffer of the result's shape to
    write it to as well, computed there directly when it has the scale's type and nothing is rounded
    after the blocks. `compiled`: whether the compiled kernel dequantizes (compiled_dequant.py; by
    default whenever it takes the weight; a caller reading a large weight in slices decides once)."""
    scale = np.asarray(scale)
    n, k = weight.shape[0], weight.shape[1] * (2 if attrs.get("packed") else 1)
    if compiled is None:
        compiled = compiled_dequant.ready(attrs, scale.dtype)
    bf16 = attrs.get("dequant_dtype") == "bf16" and scale.dtype == np.float32  # rounded block by block
    rounded_after = bool(attrs.get("dequant_dtype")) and not bf16
    direct = into is not None and into.dtype == scale.dtype and not rounded_after
    out = into if direct else buffer_pool.empty((n, k), scale.dtype)
    for lo, hi in _row_blocks(n, k):
        _dequantize_block(attrs, weight, scale, zp, lo, hi, out[lo:hi], bf16, compiled)
    if rounded_after:
        out = round_to(out.astype(np.float32, copy=False), attrs["dequant_dtype"])
    if into is not None and not direct:
        into[...] = out
    return out


def dequantize_bf16_bits(attrs: dict[str, Any], weight: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    """The bf16 bit patterns of an A16MatMul weight whose dequantizer rounds to bf16 (`dequant_dtype`
    bf16, float32 scales): `_dequantize`'s values, exact in bf16, without a whole float32 temporary (the
    host path's 16-bit cache of a model larger than its budget)."""
    scale = np.asarray(scale, dtype=np.float32)
    n, k = weight.shape[0], weight.shape[1] * (2 if attrs.get("packed") else 1)
    out = np.empty((n, k), dtype=np.uint16)
    block = np.empty(max(1, CACHE_BLOCK // k) * k, dtype=np.float32)
    compiled = compiled_dequant.ready(attrs, scale.dtype)
    for lo, hi in _row_blocks(n, k):
        values = block[: (hi - lo) * k].reshape(hi - lo, k)
        _dequantize_block(attrs, weight, scale, zp, lo, hi, values, True, compiled)
        np.right_shift(values.view(np.uint32), 16, out=out[lo:hi], casting="unsafe")
    return out


def _row_blocks(n: int, k: int) -> list[tuple[int, int]]:
    step = max(1, CACHE_BLOCK // k)
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def _dequantize_block(attrs: dict[str, Any], weight: np.ndarray, scale: np.ndarray, zp: np.ndarray, lo: int,
                      hi: int, out: np.ndarray, bf16: bool, compiled: bool = False) -> None:
    k, g = out.shape[1], attrs["q_group_size"]
    if compiled:  # the same arithmetic in one compiled loop (the caller checked compiled_dequant.ready)
        compiled_dequant.dequantize_into(weight[lo:hi], scale[lo:hi], np.asarray(zp[lo:hi]), g, out, bf16)
        return
    levels = unpack_nibbles(weight[lo:hi]) if attrs.get("packed") else np.asarray(weight[lo:hi])
    w = out.reshape(hi - lo, k // g, g)
    # Widen the levels first, then subtract in the float type: a subtraction with a uint8 operand takes
    # numpy's casting loop, several times slower (q - zero is an exact small integer either way).
    w[...] = levels.reshape(hi - lo, k // g, g)
    w -= np.asarray(zp[lo:hi]).astype(out.dtype)[:, :, None]
    w *= scale[lo:hi, :, None]
    if bf16:
        round_bf16_inplace(w, finite=bool(np.isfinite(scale[lo:hi]).all()))  # levels and zeros are finite


class DequantizedRows(RowReader):
    """A quantized weight in its storage format, dequantized slice by slice as a product reads it."""

    def __init__(self, attrs: dict[str, Any], weight: Weight, scale: Weight, zp: Weight, dtype: np.dtype):
        self.attrs, self.weight, self.scale, self.zp, self.dtype = attrs, weight, scale, zp, dtype
        cols = weight.shape[1] * (2 if attrs.get("packed") else 1)
        self.shape = (weight.shape[0], cols)
        # Decided by the whole weight, not by the slices read: a large weight is read a block at a time.
        scale_type = compute_dtype(scale.dtype) if isinstance(scale, StoredTensor) else np.dtype(scale.dtype)
        self.compiled = compiled_dequant.wanted(self.shape[0] * cols, attrs, scale_type)
        # A one-row product over it can dequantize in registers (levels_product.py).
        self.fused = levels_product.takes(attrs, cols, scale_type)

    def rows(self, lo: int, hi: int) -> np.ndarray:
        return dequantize_values(self.attrs, *self.parts(lo, hi), compiled=self.compiled).astype(self.dtype, copy=False)

    def rows_into(self, lo: int, hi: int, out: np.ndarray) -> None:
        dequantize_values(self.attrs, *self.parts(lo, hi), into=out, compiled=self.compiled)

    def parts(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows lo:hi of the levels, the scales (decoded) and the zero points, as stored."""
        return row_slice(self.weight, lo, hi), row_slice(self.scale, lo, hi), row_slice(self.zp, lo, hi)

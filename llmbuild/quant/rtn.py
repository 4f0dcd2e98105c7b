"""The incumbent's round-to-nearest quantizer (TPU-MLIR's A16MatMul lowering), for unquantized weights.

Reproduced to the bit so a build from a float checkpoint quantizes exactly as the incumbent would:
- 4-bit: per group of `group_size` input features, asymmetric uint4:
  scale = max(max - min, 1e-5) / 15, zp = clamp(-round(min / scale), 0, 15),
  q = clamp(round(w / scale) + zp, 0, 15).
- 8-bit: symmetric per output channel: scale = max|w| / 127, q = round(w / scale) in [-128, 127],
  stored as the level q + 128 with zero point 128 (our canonical levels are unsigned).
All arithmetic in float32 as the incumbent's C++ does; round is std::round (half away from zero), not
numpy's half-to-even. The 1e-5 floor on the range is the incumbent's: it keeps a constant group finite.
The 8-bit path has no such floor there (an all-zero row would divide by zero); we floor max|w| at the
same 1e-5 so an all-zero row quantizes to zeros instead of NaN.
"""

from __future__ import annotations

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.numerics.formats import CACHE_BLOCK
from llmbuild.quant import rtn_kernel
from llmbuild.quant.linear import QuantizedLinear

DEFAULT_GROUP_SIZE = 64
_RANGE_FLOOR = np.float32(1e-5)
_BELOW_HALF = np.nextafter(np.float32(0.5), np.float32(0))  # 0.49999997


def round_half_away(x: np.ndarray) -> np.ndarray:
    """std::round: exact for any float (x - trunc(x) is exact), ties away from zero."""
    t = np.trunc(x)
    frac = x - t
    return t + np.where(np.abs(frac) >= 0.5, np.sign(x), 0).astype(x.dtype)


def round_near_half_away_inplace(x: np.ndarray) -> np.ndarray:
    """`round_half_away(x)` for every float32 x in [-17, 17], in place; beyond, off by at most one (levels
    are clipped to [0, 15] after adding a zero point in [0, 15], which absorbs that). Adding the float just
    below 0.5 with x's sign and truncating: adding 0.5 itself would round 0.49999997 up to 1. Both are
    monotone step functions, so they agree everywhere once they agree around each half-integer, which
    tests/test_quant_formats.py checks float by float (all of [-17, 17] was also checked once, exhaustively)."""
    x += np.copysign(_BELOW_HALF, x)
    return np.trunc(x, out=x)


def _group_min_max(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(min, max) over the last axis of [rows, K / g, g]. The groups are transposed once so that each
    reduction runs along rows of a [g, groups] array, where numpy's loop is a vectorised elementwise
    min (max) over long rows: twice as fast as folding the short contiguous axis by halves, and 5x faster
    than reducing along it (min and max are exact, so every way gives the same values). A 1.5B model's
    weights are rounded to nearest in the build and in its reference."""
    g = groups.shape[-1]
    by_position = np.ascontiguousarray(groups.reshape(-1, g).T)
    lo = np.minimum.reduce(by_position, axis=0).reshape(groups.shape[:-1])
    hi = np.maximum.reduce(by_position, axis=0).reshape(groups.shape[:-1])
    return lo, hi


def rtn_quantize(
    weight: np.ndarray, bits: int = 4, group_size: int | None = DEFAULT_GROUP_SIZE, bias: np.ndarray | None = None
) -> QuantizedLinear:
    """Quantize a float [N, K] weight. 4-bit: per group (group_size None = per channel); 8-bit: per channel."""
    w = np.asarray(weight, dtype=np.float32)
    if w.ndim != 2:
        raise LlmbuildError(f"rtn: weight must be [N, K], got shape {list(w.shape)}")
    n, k = w.shape
    b = None if bias is None else np.asarray(bias, dtype=np.float32)
    if bits == 8:
        return _rtn_int8(w, b)
    if bits != 4:
        raise LlmbuildError(f"rtn: unsupported bits {bits}, expected 4 or 8")
    g = k if group_size in (None, -1) else int(group_size)
    if g <= 0 or k % g:
        raise LlmbuildError(f"rtn: group_size {group_size} does not divide in_features {k}")
    if rtn_kernel.takes(w, g):  # compiled, the same levels (rtn_kernel.py); None: a weight not finite
        compiled = rtn_kernel.rtn4(w, g)
        if compiled is not None:
            return QuantizedLinear(q=compiled[0], scale=compiled[1], zero=compiled[2], group_size=g, bits=4, bias=b)
    q = np.empty((n, k), dtype=np.uint8)
    scale = np.empty((n, k // g), dtype=np.float32)
    zp = np.empty((n, k // g), dtype=np.float32)
    # In row blocks that stay in the L2 cache: twice as fast as whole-matrix passes (a 1.5B layer's
    # projections are 46M weights, rounded in the build and again in its reference).
    step = max(1, CACHE_BLOCK // k)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        q[lo:hi], scale[lo:hi], zp[lo:hi] = _rtn4_block(w[lo:hi].reshape(hi - lo, k // g, g))
    return QuantizedLinear(q=q, scale=scale, zero=zp, group_size=g, bits=4, bias=b)


def _rtn4_block(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(levels [rows, K] uint8, scale, zero point) of float32 weights in groups [rows, K / g, g]."""
    lo, hi = _group_min_max(groups)
    scale = np.maximum(hi - lo, _RANGE_FLOOR) / np.float32(15)
    zp = np.clip(-round_half_away(lo / scale), 0, 15)
    # round_half_away(w / scale) + zp, clipped to [0, 15], in place on one array: five passes instead of
    # ten (the build and its reference round a 1.5B model's 1.3 billion weights).
    x = round_near_half_away_inplace(groups / scale[:, :, None])
    x += zp[:, :, None]
    np.clip(x, 0, 15, out=x)
    return x.reshape(groups.shape[0], -1).astype(np.uint8), scale, zp


def _rtn_int8(w: np.ndarray, bias: np.ndarray | None) -> QuantizedLinear:
    n, k = w.shape
    scale = np.maximum(np.abs(w).max(axis=1, keepdims=True), _RANGE_FLOOR) / np.float32(127)
    q = np.clip(round_half_away(w / scale), -128, 127) + 128
    zero = np.full((n, 1), 128, dtype=np.float32)
    return QuantizedLinear(q=q.astype(np.uint8), scale=scale, zero=zero, group_size=k, bits=8, bias=bias)

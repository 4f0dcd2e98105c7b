"""The 4-bit dequantizer of A16MatMul compiled to one loop (numba), with the bits of numpy's passes.

A 7B w4 binary on the host dequantizes, for every token, each projection its cache does not hold: some
5G weights. `dequantize._dequantize_block` does it in eight numpy passes (unpack the nibbles, widen, subtract
the zero point, multiply by the scale, then five integer passes that round to bf16), each reading and
writing the whole block. Compiled, the same arithmetic is one pass over the packed bytes and one over the
result while it is in the cache (its figures when introduced: the history of docs/performance.md).

Same bits: for every weight, float32(level) - float32(zero), times the float32 scale, in float32 (numba
without fastmath neither contracts nor reorders), then round-to-nearest-even on the bit pattern with a NaN
made the canonical bf16 NaN, as `formats.round_bf16_inplace` does. tests/test_compiled_dequant.py compares
the two bit for bit, non-finite scales included.

Costs: importing numba takes about 0.5 s and loading the cached machine code a little more, so only a
weight of `MIN_WEIGHTS` or more uses the kernel, and a process that meets none (SmolLM2's build) never
imports numba. Without numba (an interpreter it has no wheel for) the numpy passes run: slower, same bits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

# The smallest weight (elements) worth the import: a 1.5B model's MLP projections (1536 x 8960) and up.
MIN_WEIGHTS = 1 << 23

_lock = threading.Lock()
_loaded = False
_kernel: Callable[..., None] | None = None


def wanted(weights: int, attrs: dict[str, Any], scale_dtype: np.dtype) -> bool:
    """Whether a weight of `weights` elements dequantized under `attrs` goes through the compiled kernel."""
    return (weights >= MIN_WEIGHTS and bool(attrs.get("packed")) and attrs.get("dequant_dtype") == "bf16"
            and scale_dtype == np.float32 and kernel() is not None)


def kernel() -> Callable[..., None] | None:
    """The compiled dequantizer, `(packed u8 [r, K/2], scale f32 [r, K/g], zero f32 [r, K/g], g, out f32
    [r, K])`, compiled (or loaded from numba's cache) on first use; None without numba."""
    global _loaded, _kernel
    if not _loaded:
        with _lock:
            if not _loaded:
                _kernel = _compile()
                _loaded = True
    return _kernel


def dequantize_into(packed: np.ndarray, scale: np.ndarray, zero: np.ndarray, group: int, out: np.ndarray) -> None:
    """`out` [r, K] = bf16((level - zero) * scale), the levels two to a byte (even k in the low nibble)."""
    run = kernel()
    assert run is not None, "compiled_dequant.dequantize_into without numba (check wanted() first)"
    target = out if out.flags.c_contiguous and out.dtype == np.float32 else np.empty(out.shape, np.float32)
    run(np.ascontiguousarray(packed, dtype=np.uint8), np.ascontiguousarray(scale, dtype=np.float32),
        np.ascontiguousarray(zero, dtype=np.float32), group, target)
    if target is not out:
        out[...] = target


def _compile() -> Callable[..., None] | None:
    try:
        import numba
    except ImportError:
        return None

    # nogil: the decode step's threads run it side by side (numerics/parallel.py); cache: machine code is
    # written beside this file (or numba's user cache) once, not compiled in every build step.
    @numba.njit(nogil=True, cache=True, boundscheck=False)
    def dequantize(packed: Any, scale: Any, zero: Any, group: int, out: Any) -> None:  # pragma: no cover (compiled)
        rows, k = out.shape
        for r in range(rows):
            values, levels = out[r], packed[r]
            # Three simple loops over the row, each of which LLVM vectorizes: the levels widened, (level -
            # zero) * scale a group at a time (a slice indexed from 0: indexing the row from the group's
            # offset instead left that loop scalar, 3x slower), then the rounding of the bit patterns.
            for j in range(k // 2):
                byte = levels[j]
                values[2 * j] = np.float32(byte & np.uint8(15))
                values[2 * j + 1] = np.float32(byte >> np.uint8(4))
            for g in range(k // group):
                s, z = scale[r, g], zero[r, g]
                block = values[g * group : (g + 1) * group]
                for i in range(group):
                    block[i] = (block[i] - z) * s
            bits = values.view(np.uint32)
            for c in range(k):
                b = bits[c]
                rounded = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
                nan = (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
                bits[c] = np.uint32(0x7FC00000) if nan else np.uint32(rounded)

    return dequantize

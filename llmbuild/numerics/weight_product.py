"""`x @ w^T` with a weight in whatever holds it: the product of MatMul and A16MatMul on every executor.

A float32 product has one arithmetic, numerics/vector_product.py's (each output one sum over the whole K
in 64 lanes and a fixed tree), computed for one row by vector_product's kernel and for many by
matrix_product's. Each output is one thread's sum, so tiles, thread counts and how the weight is held
change no bit: the device's tile-by-tile run, the host path's whole-op run and a prefill row against the
same row in a decode step all agree bit for bit.

The weight is read as it is held: a decoded array; 16-bit weights as stored (the kernels widen them as they
read, half the bytes of float32); a file image's rows a chunk at a time; a quantized weight dequantized a
cache-sized block of rows at a time into one reused buffer per thread (fresh pages for every block cost
more than decoding into them, and a block leaves the cache before a product over a whole matrix reads it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from llmbuild.numerics import compiled_dequant, lazy_zeros, levels_product, matrix_product
from llmbuild.numerics.dequantize import DequantizedRows
from llmbuild.numerics.formats import CACHE_BLOCK
from llmbuild.numerics.parallel import row_spans
from llmbuild.numerics.stored import RowReader, StoredTensor, Weight, row_slice

LAZY_WHOLE_BYTES = 64 << 20  # build/resources.py: TABLE_BLOCK
# Weights a compiled dequantizing product decodes and multiplies at once, as bf16 bit patterns (1 MiB a
# thread, in its L2 cache; benchmarks/product_kernels.py). As float32 blocks of 4 MiB (the calls from
# Python bound smaller ones), a 19-row prefill's 8960 x 1536 product took 8.3 ms on two threads; as bf16
# blocks of 128K, 256K, 512K and 1M weights, 8.7, 7.2, 6.7 and 6.7 ms (the product reads half the bytes,
# the faster bf16 kernel).
COMPILED_BLOCK = 1 << 19
# Packed levels read from the weight image at once (one read of each part, then the cache-sized blocks).
LEVEL_CHUNK_BYTES = 4 << 20


def tiled_product(attrs: dict[str, Any], x: np.ndarray, w_nk: Weight) -> np.ndarray:
    """`x @ w_nk^T`. `active_rows` (set by an executor for one run, never in the IR): only rows <
    active_rows are computed, the rest of the result is zero; each row's outputs depend on that row alone,
    so they are the bits the device computes for it in whichever tile holds it (the device computes the
    rest of that tile too, from padding no real row reads). `untiled` (the float TopOp reference): numpy's
    product over the real rows, the weight read in blocks of rows."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    m, n = x2.shape[0], w_nk.shape[0]
    active = attrs.get("active_rows") or m
    if attrs.get("untiled") or x2.dtype != np.float32:
        return _numpy_product(x2, w_nk, active).reshape(*lead, n)
    rows = min(m, active)
    out = np.empty((m, n), dtype=np.float32) if rows == m else lazy_zeros.zeros((m, n), np.float32)
    product_into(x2[:rows], w_nk, out[:rows])
    return out.reshape(*lead, n)


def plus_bias(attrs: dict[str, Any], y: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """`y + bias` for `tiled_product`'s result `y`: with `active_rows`, added in place to those rows only
    (the rows after them stay zeros, which no real row reads, instead of a whole new array of the net's
    static rows: a prefill of 19 tokens in a 2048-row net added biases to 2048 rows)."""
    if bias is None:
        return y
    active = attrs.get("active_rows")
    rows = y.reshape(-1, y.shape[-1]) if y.ndim >= 2 and y.flags.c_contiguous else None
    if (not active or rows is None or active >= rows.shape[0] or y.dtype != np.float32
            or np.result_type(y, bias) != y.dtype or bias.shape != y.shape[-1:]):
        return y + bias
    np.add(rows[:active], bias, out=rows[:active])
    return y


def _numpy_product(x2: np.ndarray, w_nk: Weight, active: int) -> np.ndarray:
    m, k = x2.shape
    n = w_nk.shape[0]
    tn = n
    if isinstance(w_nk, RowReader) and 4 * n * k > LAZY_WHOLE_BYTES:
        tn = max(1, LAZY_WHOLE_BYTES // (4 * k))  # a 7B vocabulary table, read in blocks of rows
    out = lazy_zeros.zeros((m, n), np.result_type(x2.dtype, np.float32))
    for c in range(0, n, tn):
        out[:active, c : c + tn] = x2[:active] @ row_slice(w_nk, c, c + tn).T
    return out


def product_into(x2: np.ndarray, w_nk: Weight, out: np.ndarray) -> None:
    """out [M, N] = x2 [M, K] (float32) times w_nk [N, K], in vector_product's arithmetic."""
    n, k = w_nk.shape
    if isinstance(w_nk, np.ndarray):
        weight = w_nk if w_nk.dtype in (np.float32, np.float16) else w_nk.astype(np.float32)
        matrix_product.product(x2, weight, out)
    elif isinstance(w_nk, StoredTensor) and w_nk.dtype in ("bf16", "f16", "f32") and len(w_nk.shape) == 2:
        if isinstance(w_nk.raw, np.ndarray):
            matrix_product.product(x2, w_nk.raw, out)  # bf16 bits, f16 or f32, widened in the kernel
        else:  # a file read on demand (weight_image.FileArray): chunks of rows
            step = max(1, LEVEL_CHUNK_BYTES // (k * w_nk.raw.dtype.itemsize))
            for lo in range(0, n, step):
                matrix_product.product(x2, np.asarray(w_nk.raw[lo : lo + step]), out[:, lo : lo + step])
    elif isinstance(w_nk, DequantizedRows) and w_nk.fused and x2.shape[0] == 1:
        _levels_product(x2[0], w_nk, out[0])
    elif isinstance(w_nk, DequantizedRows) and w_nk.compiled:
        _compiled_product(x2, w_nk, max(1, COMPILED_BLOCK // k), out)
    else:  # any other reader (another storage type, a quantized weight): decoded a block of rows at a time
        step = max(1, CACHE_BLOCK // k)
        buffer = _decode_buffer(min(step, n) * k).reshape(-1, k)
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            w_nk.rows_into(lo, hi, buffer[: hi - lo])
            matrix_product.product(x2, buffer[: hi - lo], out[:, lo:hi])


def _compiled_product(x2: np.ndarray, w_nk: DequantizedRows, step: int, out: np.ndarray) -> None:
    """`product_into` of a 4-bit weight the compiled kernel dequantizes: each thread takes a contiguous span
    of rows, reads its levels, scales and zeros a chunk at a time, and dequantizes and multiplies `step`
    rows of it at once in its own buffer, as bf16 bit patterns (exact: the kernel takes only weights whose
    dequantizer rounds to bf16, compiled_dequant.wanted; each output is one thread's, whole: the spans and
    blocks change no bit; tests/test_compiled_dequant.py, on 1 to 3 threads)."""
    n, k = w_nk.shape
    group = w_nk.attrs["q_group_size"]
    chunk = max(step, LEVEL_CHUNK_BYTES // max(1, k // 2) // step * step)

    def blocks(c0: int, c1: int, levels: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> None:
        buffer = _decode_buffer(min(step, c1 - c0) * k, np.uint16).reshape(-1, k)
        for lo in range(c0, c1, step):
            hi = min(c1, lo + step)
            rows = slice(lo - c0, hi - c0)
            compiled_dequant.dequantize_into(levels[rows], scale[rows], zero[rows], group, buffer[: hi - lo])
            matrix_product.product(x2, buffer[: hi - lo], out[:, lo:hi])

    row_spans(n, n * k, 0, lambda lo, hi: _level_chunks(w_nk, lo, hi, chunk, blocks))


def _levels_product(x: np.ndarray, w_nk: DequantizedRows, out: np.ndarray) -> None:
    """A one-row product from the levels as stored (levels_product.py): in one call when they are in memory
    (the kernel splits its rows over the cores itself), else a chunk of rows at a time on each thread's
    span (a file's pages read on the thread that multiplies them)."""
    n, k = w_nk.shape
    if all(_in_memory(part) for part in (w_nk.weight, w_nk.scale, w_nk.zp)):
        levels, scale, zero = w_nk.parts(0, n)  # views
        if (levels.dtype == np.uint8 and scale.dtype == np.float32 and zero.dtype == np.float32
                and all(part.flags.c_contiguous for part in (levels, scale, zero))):
            levels_product.product(x, w_nk.attrs, levels, scale, zero, out)
            return
    chunk = max(1, LEVEL_CHUNK_BYTES // max(1, w_nk.weight.shape[1]))

    def multiply(c0: int, c1: int, levels: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> None:
        levels_product.product(x, w_nk.attrs, levels, scale, zero, out[c0:c1])

    row_spans(n, n * k, levels_product.PARALLEL_WEIGHTS, lambda lo, hi: _level_chunks(w_nk, lo, hi, chunk, multiply))


def _in_memory(part: Weight) -> bool:
    """Whether a weight's rows are read from memory (not from a file a read at a time)."""
    return isinstance(part, np.ndarray) or (isinstance(part, StoredTensor) and isinstance(part.raw, np.ndarray))


def _level_chunks(w_nk: DequantizedRows, lo: int, hi: int, chunk: int,
                  each: Callable[[int, int, np.ndarray, np.ndarray, np.ndarray], None]) -> None:
    """`each(c0, c1, levels, scale, zero)` over rows lo:hi of a quantized weight, `chunk` rows at a time, the
    parts read as stored (a file image's pages fault in on the thread that reads them) and made contiguous:
    levels as uint8, scales and zeros as float32."""
    for c0 in range(lo, hi, chunk):
        c1 = min(hi, c0 + chunk)
        levels, scale, zero = w_nk.parts(c0, c1)
        each(c0, c1, np.ascontiguousarray(levels, dtype=np.uint8), np.ascontiguousarray(scale, dtype=np.float32),
             np.ascontiguousarray(zero, dtype=np.float32))


_decode_buffers = threading.local()


def _decode_buffer(size: int, dtype: type = np.float32) -> np.ndarray:
    """This thread's reused buffer of at least `size` elements of `dtype` (float32, or uint16 bit patterns)."""
    name = f"buffer_{np.dtype(dtype).name}"
    buffer = getattr(_decode_buffers, name, None)
    if buffer is None or buffer.size < size:
        buffer = np.empty(size, dtype=dtype)
        setattr(_decode_buffers, name, buffer)
    return buffer[:size]

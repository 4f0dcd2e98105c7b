"""The host's kernels: every op as the executors run it (the device simulator, the host path, the float32
interpreter), keyed by op name without the dialect prefix.

An op's kernel is its plain spec kernel (`llmbuild/op_defs/`) unless it has an optimised one here (`@kernel`):
products tiled as the chip tiles them, weights read in their storage format, a cached or compiled
dequantizer, attention in key blocks. tests/test_spec_kernels.py holds each to its spec.

A kernel takes its operands (arrays, already in the compute dtype: float64 for the reference, float32 on
the device) and a dict of plain attributes, and returns the result in the same compute dtype. Rounding
to the stored element type is the caller's business (see llmbuild.numerics.formats.round_to).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from llmbuild.numerics import buffer_pool, compiled_dequant, lazy_zeros, vector_product
from llmbuild.numerics.formats import CACHE_BLOCK, compute_dtype, round_bf16_inplace, round_to
from llmbuild.numerics.parallel import tile_map, workers
from llmbuild.numerics.stored import (
    RowReader,
    StoredTensor,
    Weight,
    is_lazy,
    materialize,
    row_slice,
    take_rows,
)
from llmbuild.op_defs import OPS, Kernel, OpDef, spec_kernels
from llmbuild.op_defs.active import ACTIVATIONS, erf, gelu, gelu_tanh, silu
from llmbuild.op_defs.gated_delta_rule import head_block
from llmbuild.op_defs.gated_delta_rule import spec as delta_rule_spec
from llmbuild.op_defs.rotary_embedding import rotate_half
from llmbuild.op_defs.softmax import softmax

__all__ = ["ACTIVATIONS", "KERNELS", "erf", "gelu", "gelu_tanh", "host_kernels", "rotate_half", "silu", "softmax"]

OPTIMISED: dict[str, Kernel] = {}  # the ops whose host kernel is not their spec kernel


def kernel(name: str) -> Callable[[Kernel], Kernel]:
    def register(fn: Kernel) -> Kernel:
        OPTIMISED[name] = fn
        return fn

    return register


def host_kernels(defs: Iterable[OpDef]) -> dict[str, Kernel]:
    """The kernel the executors run for each op of `defs` (and each top op): the optimised one, else the spec."""
    table = spec_kernels(defs)
    return table | {name: fn for name, fn in OPTIMISED.items() if name in table}


@kernel("Gather")
def gather(attrs: dict[str, Any], table: Weight, indices: np.ndarray) -> np.ndarray:
    idx = np.asarray(indices).astype(np.int64)
    n = table.shape[attrs["axis"]]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"Gather index out of range [0, {n}): {idx.min()}..{idx.max()}")
    if isinstance(table, RowReader):  # a table in its storage format: only the looked-up rows are decoded
        return table.take(idx)
    return np.take(table, idx, axis=attrs["axis"])


# Rows per tile of a product the layer-group pass did not tile by rows: a fixed size, so that the tiles,
# and with them the bits, do not depend on how many threads run them (numerics/parallel.py).
ROW_TILE = 32
# What an executor given the count of real tokens may compute (each definition's `real_rows`, with its top
# forms' names): the row tiles holding real tokens (ROW_SKIPPING) or the real rows alone (ROW_LOCAL), zeros
# after them. Shared by the interpreter and the host path.
ROW_SKIPPING = frozenset(name for op in OPS if op.real_rows == "skipping" for name in op.names())
ROW_LOCAL = frozenset(name for op in OPS if op.real_rows == "local" for name in op.names())

def on_real_rows(compute: Callable[..., np.ndarray], xs: Sequence[np.ndarray], cut: Sequence[bool],
                 shape: tuple[int, ...], n: int) -> np.ndarray:
    """A ROW_LOCAL op on the first `n` rows (axis 1) only: the operands flagged in `cut` are cut to them,
    the result of the full `shape` is zero after them."""
    part = compute(*[x[:, :n] if c else x for x, c in zip(xs, cut, strict=True)])
    out = lazy_zeros.zeros(shape, part.dtype)
    out[:, :n] = part
    return out
LAZY_WHOLE_BYTES = 64 << 20  # build/resources.py: TABLE_BLOCK
PARALLEL_MIN_MACS = 1 << 24  # below this a column of tiles runs on the calling thread (same bits either way)


def tiled_product(attrs: dict[str, Any], x: np.ndarray, w_nk: Weight) -> np.ndarray:
    """`x @ w_nk^T`, computed tile by tile.

    `tile_m` (rows of x) and `tile_n` (rows of the [N, K] weight) are the op's tiles in local memory when
    the layer-group pass tiled it; otherwise tiles of ROW_TILE rows and the whole N. The chip accumulates
    each output over the whole K in one order whatever the tiling; BLAS does not (its blocking depends on
    M, N and its thread count), so both executors compute exactly these tiles, each one single-threaded
    product: the device's tile-by-tile run and the host's whole-op run then agree bit for bit, on any
    number of threads.

    `w_nk` may be a RowReader (a weight still in its storage format): each N tile is decoded when it is
    used, so a product never holds more than one decoded tile. `active_rows` (set by an executor for one
    run, never in the IR): only the row tiles holding rows < active_rows are computed, the rest of the
    result is zero; the computed tiles are the same tiles, so their bits are those of the whole product.

    A one-row product in float32 (a decode step; a one-row tile) is not BLAS's: it has the arithmetic of
    numerics/vector_product.py, in which every output is one sum over the whole K, so N tiles change no bit.
    """
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    m, n = x2.shape[0], w_nk.shape[0]
    tm, tn = attrs.get("tile_m", 0) or ROW_TILE, attrs.get("tile_n", 0) or n
    active = attrs.get("active_rows") or m
    if m == 1 and x2.dtype == np.float32 and not attrs.get("untiled") and _vector_weight(w_nk):
        # A one-row product (a decode step, the lm_head): the arithmetic of vector_product.py, each output
        # one sum over the whole K, so the N tiles need not be cut (SmolLM2's lm_head is 12 of them).
        return _vector_product(x2, w_nk).reshape(*lead, n)
    if attrs.get("untiled"):  # the float TopOp reference: no tiles to match, one product over the real rows
        if isinstance(w_nk, RowReader) and 4 * n * k > LAZY_WHOLE_BYTES:
            tn = max(1, LAZY_WHOLE_BYTES // (4 * k))  # a 7B vocabulary table, read in blocks of rows
        out = lazy_zeros.zeros((m, n), np.result_type(x2.dtype, np.float32))
        for c in range(0, n, tn):
            out[:active, c : c + tn] = x2[:active] @ row_slice(w_nk, c, c + tn).T
        return out.reshape(*lead, n)
    if m <= tm and n <= tn:
        return x @ _whole(w_nk).T
    rows = min(m, -(-active // tm) * tm)
    dtype = np.result_type(x2.dtype, np.float32)
    out = np.empty((m, n), dtype=dtype) if rows == m else lazy_zeros.zeros((m, n), dtype)
    row_tiles = list(range(0, rows, tm))
    starts = list(range(0, n, tn))
    if tn >= n:  # a whole-N weight keeps its transposed view (no copy)
        _tile_column(x2, _whole(w_nk).T, out, 0, tm, k, row_tiles)
        return out.reshape(*lead, n)
    # An N slice is made contiguous, as the device holds it in local memory. A weight in its storage format
    # is decoded (dequantized) a few slices at a time on the tile threads: decoding costs more than the
    # product it feeds, and a slice's values do not depend on which thread decodes it.
    batch = workers() if isinstance(w_nk, RowReader) else 1
    for b in range(0, len(starts), batch):
        group = starts[b : b + batch]
        slices = tile_map(lambda c: np.ascontiguousarray(row_slice(w_nk, c, c + tn)), group)
        for c, w in zip(group, slices, strict=True):
            _tile_column(x2, w.T, out, c, tm, k, row_tiles)
    return out.reshape(*lead, n)


# A weight decoded whole for one product goes into this thread's scratch buffer, reused by the next product:
# a prefill on the host decodes every stored weight (5 GB of float32 for a 1.5B w4 model), and faulting in
# and zeroing fresh pages for each cost more than the decoding. Larger weights (a vocabulary table) are
# decoded into memory of their own, as before, so the buffer stays small beside the model.
_SCRATCH_LIMIT = 512 << 20
_scratch = threading.local()


def _whole(w: Weight) -> np.ndarray:
    """`w` whole, as the product reads it: a RowReader decoded (into the scratch buffer when it is float32 and
    small enough; the result is valid until this thread's next product)."""
    if not isinstance(w, RowReader) or not _decodes_to_f32(w) or 4 * w.shape[0] * w.shape[1] > _SCRATCH_LIMIT:
        return materialize(w)
    n, k = w.shape
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None or buffer.size < n * k:
        buffer = _scratch.buffer = np.empty(n * k, dtype=np.float32)
    out = buffer[: n * k].reshape(n, k)
    for lo, hi in _row_blocks(n, k):
        w.rows_into(lo, hi, out[lo:hi])
    return out


def _decodes_to_f32(w: RowReader) -> bool:
    if isinstance(w, StoredTensor):
        return w.dtype in ("bf16", "f16", "f32") and len(w.shape) == 2
    return isinstance(w, DequantizedRows) and w.dtype == np.float32


def _vector_weight(w: Weight) -> bool:
    """Whether a one-row product over `w` takes vector_product's arithmetic: a float32 or float16 matrix
    (the types its kernel reads as they are), or a reader that decodes to float32."""
    if isinstance(w, np.ndarray):
        return w.ndim == 2 and w.dtype in (np.float32, np.float16)
    return isinstance(w, RowReader) and _decodes_to_f32(w)


def _vector_product(x: np.ndarray, w_nk: Weight) -> np.ndarray:
    """`x @ w_nk^T` for one float32 row of x (a decode step) in vector_product's arithmetic, whatever holds
    the weight: a decoded array; 16-bit weights as stored (the kernel widens them as it reads, half the
    bytes of float32); a file image's rows read a chunk at a time; a quantized weight dequantized a
    cache-sized block of rows at a time into one reused buffer (decoding a 1.5B model's weights into fresh
    float32 tiles for every token was 40% of the build's end-to-end check: the pages of each new tile
    must be faulted in and zeroed, and the tile leaves the cache before the product reads it). Each
    output is one sum over the whole K, so no way of cutting the rows changes a bit."""
    n, k = w_nk.shape
    out = np.empty((1, n), dtype=np.float32)
    row = x.reshape(-1)
    if isinstance(w_nk, np.ndarray):
        vector_product.product(row, w_nk, out[0])
    elif isinstance(w_nk, StoredTensor) and isinstance(w_nk.raw, np.ndarray):
        vector_product.product(row, w_nk.raw, out[0])  # bf16 bits, f16 or f32, widened in the kernel
    elif isinstance(w_nk, StoredTensor):  # a file read on demand (weight_image.FileArray): chunks of rows
        step = max(1, LEVEL_CHUNK_BYTES // (k * w_nk.raw.dtype.itemsize))
        for lo in range(0, n, step):
            vector_product.product(row, np.asarray(w_nk.raw[lo : lo + step]), out[0, lo : lo + step])
    elif isinstance(w_nk, DequantizedRows) and w_nk.compiled:
        _compiled_vector_product(row, w_nk, max(1, COMPILED_BLOCK // k), out)
    else:
        step = max(1, CACHE_BLOCK // k)
        buffer = _decode_buffer(min(step, n) * k).reshape(-1, k)
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            w_nk.rows_into(lo, hi, buffer[: hi - lo])
            vector_product.product(row, buffer[: hi - lo], out[0, lo:hi])
    return out


# Floats a compiled decode step dequantizes and multiplies at once (4 MiB a thread, in the L3 cache): the
# per-block calls from Python, not the cache, bound the speed (0.34 -> 0.20 ns a weight on two threads
# from 1 to 4 MiB, a 7B projection, when measured; the history of docs/performance.md).
COMPILED_BLOCK = 1 << 20
# Packed levels a compiled decode step reads from the weight image at once (one read of each part, then
# the cache-sized blocks): fewer, larger reads, as the dequantizer no longer hides their cost.
LEVEL_CHUNK_BYTES = 4 << 20


def _compiled_vector_product(x: np.ndarray, w_nk: DequantizedRows, step: int, out: np.ndarray) -> None:
    """`_vector_product` of a 4-bit weight the compiled kernel dequantizes: each thread takes a contiguous
    span of rows, reads its levels, scales and zeros a chunk at a time, and dequantizes and multiplies
    `step` rows of it at once in its own buffer (each output is one thread's, whole: the spans and blocks
    change no bit; tests/test_compiled_dequant.py, on 1 to 3 threads)."""
    n, k = w_nk.shape
    group = w_nk.attrs["q_group_size"]
    chunk = max(step, LEVEL_CHUNK_BYTES // max(1, k // 2) // step * step)

    def span(bounds: tuple[int, int]) -> None:
        buffer = _decode_buffer(min(step, bounds[1] - bounds[0]) * k).reshape(-1, k)
        for c0 in range(bounds[0], bounds[1], chunk):
            c1 = min(bounds[1], c0 + chunk)
            levels, scale, zero = w_nk.parts(c0, c1)
            zero = np.asarray(zero, dtype=np.float32)
            for lo in range(c0, c1, step):
                hi = min(c1, lo + step)
                rows = slice(lo - c0, hi - c0)
                compiled_dequant.dequantize_into(levels[rows], scale[rows], zero[rows], group, buffer[: hi - lo])
                vector_product.product(x, buffer[: hi - lo], out[0, lo:hi])

    threads = workers()
    per = -(-n // threads)
    spans = [(lo, min(n, lo + per)) for lo in range(0, n, per)]
    if len(spans) == 1:
        span(spans[0])
    else:
        tile_map(span, spans)


_decode_buffers = threading.local()


def _decode_buffer(size: int) -> np.ndarray:
    """This thread's reused float32 buffer of at least `size` (fresh pages for every product cost more than
    decoding into them)."""
    buffer = getattr(_decode_buffers, "buffer", None)
    if buffer is None or buffer.size < size:
        buffer = _decode_buffers.buffer = np.empty(size, dtype=np.float32)
    return buffer[:size]


def _tile_column(x2: np.ndarray, w_kn: np.ndarray, out: np.ndarray, c: int, tm: int, k: int,
                 row_tiles: list[int]) -> None:
    """Columns c.. of the result: every row tile times one N slice of the weight ([K, tn], transposed)."""
    tn = w_kn.shape[1]

    def tile(r: int) -> None:
        rows = np.ascontiguousarray(x2[r : r + tm])
        if rows.shape[0] == 1 and rows.dtype == np.float32:
            # A one-row tile (a vision tower's 1025th token): the device's command for it is a one-row product.
            vector_product.product(rows[0], w_kn.T, out[r, c : c + tn])
        else:
            out[r : r + tm, c : c + tn] = rows @ w_kn

    if len(row_tiles) * tm * tn * k < PARALLEL_MIN_MACS:  # threads cost more than they save
        for r in row_tiles:
            tile(r)
    else:
        tile_map(tile, row_tiles)


@kernel("MatMul")
def matmul(attrs: dict[str, Any], x: np.ndarray, right: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    y = tiled_product(attrs, x, right) if attrs["right_transpose"] else x @ right
    if bias is not None:
        y = y + bias
    if attrs.get("do_relu"):
        y = np.maximum(y, 0)
    return y


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """[N, K/2] bytes -> [N, K] 4-bit levels, even k from the low nibble."""
    b = np.asarray(packed).astype(np.uint8)
    q = np.empty((b.shape[0], b.shape[1] * 2), dtype=np.uint8)
    q[:, 0::2] = b & 0xF
    q[:, 1::2] = b >> 4
    return q


# Runtimes hand the same (cached, read-only) weight arrays to every call: dequantize each weight once.
# Keyed by the arrays' identities, holding them so the ids stay valid; bounded, oldest out first.
_DEQUANT_CACHE: dict[tuple, tuple[tuple[np.ndarray, ...], np.ndarray]] = {}
_DEQUANT_CACHE_SIZE = 512


def dequantize(attrs: dict[str, Any], weight: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    key = (id(weight), id(scale), id(zp), attrs.get("packed"), attrs["q_group_size"], attrs.get("dequant_dtype"))
    hit = _DEQUANT_CACHE.get(key)
    if hit is not None and hit[0][0] is weight and hit[0][1] is scale and hit[0][2] is zp:
        return hit[1]
    w = _dequantize(attrs, weight, scale, zp)
    if not (weight.flags.writeable or scale.flags.writeable or zp.flags.writeable):
        if len(_DEQUANT_CACHE) >= _DEQUANT_CACHE_SIZE:
            _DEQUANT_CACHE.pop(next(iter(_DEQUANT_CACHE)))
        _DEQUANT_CACHE[key] = ((weight, scale, zp), w)
    return w


def dequantize_uncached(attrs: dict[str, Any], weight: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    """`dequantize` for a caller that keeps the result itself (the host path's bounded cache)."""
    return _dequantize(attrs, weight, scale, zp)


def clear_dequantize_cache() -> None:
    """Forget every cached dequantized weight (a build step done with one layer's weights): nothing may read
    an array `dequantize` returned after this; their memory goes to the next layer's (buffer_pool.py)."""
    buffer_pool.give_back(w for _, w in _DEQUANT_CACHE.values())
    _DEQUANT_CACHE.clear()


def _dequantize(attrs: dict[str, Any], weight: np.ndarray, scale: np.ndarray, zp: np.ndarray,
                into: np.ndarray | None = None, compiled: bool | None = None) -> np.ndarray:
    """(levels - zero) * scale per group of K, in the scale's type; with `dequant_dtype`, rounded to it as
    the device's dequantizer does. Into one array, in row blocks that stay in the L2 cache (twice as fast
    as whole-matrix passes: a 7B projection is 68M values). `into`: a buffer of the result's shape to
    write it to as well, computed there directly when it has the scale's type and nothing is rounded
    after the blocks. `compiled`: whether the compiled kernel dequantizes (compiled_dequant.py; the
    default decides by this weight's size; a caller reading a large weight in slices decides once)."""
    scale = np.asarray(scale)
    n, k = weight.shape[0], weight.shape[1] * (2 if attrs.get("packed") else 1)
    if compiled is None:
        compiled = compiled_dequant.wanted(n * k, attrs, scale.dtype)
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
    compiled = compiled_dequant.wanted(n * k, attrs, scale.dtype)
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
    if compiled:  # the same arithmetic in one compiled loop (the caller checked compiled_dequant.wanted)
        compiled_dequant.dequantize_into(weight[lo:hi], scale[lo:hi], np.asarray(zp[lo:hi]), g, out)
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

    def rows(self, lo: int, hi: int) -> np.ndarray:
        return _dequantize(self.attrs, *self.parts(lo, hi), compiled=self.compiled).astype(self.dtype, copy=False)

    def rows_into(self, lo: int, hi: int, out: np.ndarray) -> None:
        _dequantize(self.attrs, *self.parts(lo, hi), into=out, compiled=self.compiled)

    def parts(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows lo:hi of the levels, the scales (decoded) and the zero points, as stored."""
        return row_slice(self.weight, lo, hi), row_slice(self.scale, lo, hi), row_slice(self.zp, lo, hi)


@kernel("A16MatMul")
def a16_matmul(
    attrs: dict[str, Any], x: np.ndarray, weight: Weight, scale: Weight, zp: Weight,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    if is_lazy(weight, scale, zp):
        y = tiled_product(attrs, x, DequantizedRows(attrs, weight, scale, zp, x.dtype))
    else:
        # copy=False: the cached dequantized weight is already in x's dtype on both executors; a plain
        # astype copied the whole matrix on every call (what made the host's w4 decode slower than bf16).
        y = tiled_product(attrs, x, dequantize(attrs, weight, scale, zp).astype(x.dtype, copy=False))
    return y if bias is None else y + bias


@kernel("A16Gather")
def a16_gather(
    attrs: dict[str, Any], weight: Weight, scale: Weight, zp: Weight, indices: np.ndarray
) -> np.ndarray:
    # Only the looked-up rows are dequantized: a 49k-row table is never expanded for a few tokens.
    idx = np.asarray(indices).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= weight.shape[0]):
        raise IndexError(f"A16Gather index out of range [0, {weight.shape[0]}): {idx.min()}..{idx.max()}")
    flat = idx.reshape(-1)
    rows = _dequantize(attrs, take_rows(weight, flat), take_rows(scale, flat), take_rows(zp, flat))
    return rows.reshape(idx.shape + rows.shape[-1:])


# Scores of one block of query rows that FAttention holds at once when no tiles are given (32 MiB in f64):
# attention then runs in bounded memory at any length, blocks of whole query rows, one softmax each.
ATTENTION_BLOCK_SCORES = 1 << 22


@kernel("FAttention")
def fattention(attrs: dict[str, Any], *args: np.ndarray) -> np.ndarray:
    """Grouped-query attention (operands q, k, v, mask), cut as its tile attributes say.

    - `tile_kvh` (set by the layer-group pass): blocks of that many KV heads (with their query heads);
    - `tile_q`: blocks of that many query rows (local memory's row tiles);
    - `tile_k`: keys in blocks of that many rows with an online softmax (flash attention), per block in
      f32: scores = q·kᵀ·scale + mask, new running max, p = exp(scores - max), running sum and
      accumulator rescaled by exp(old max - new max), and at the end accumulator / sum. Without tile_q
      the query block is every row (the pass sized the block to fit local memory).
    Without tile_k each query block is one exact softmax over every key; without tile_q its rows are
    bounded by ATTENTION_BLOCK_SCORES scores. Every block is made contiguous, as the device reads it, so
    the device's commands (one per block, `flash_block` / `flash_end`) and this whole-op call compute the
    same products on the same arrays: the same bits.

    `active_rows` (set by an executor for one run, never in the IR): only the query blocks holding rows
    < active_rows are computed, the same blocks as in the whole computation; other rows are zero.

    A device command of a blocked attention carries `g_flash`: "block" (operands q, k, v, mask and the
    running state from the previous block, absent for the first) returns the new state; "end" (operand:
    the state) returns the output rows.
    """
    step = attrs.get("g_flash")
    if step == "block":
        return flash_block(attrs, *args)
    if step == "end":
        return flash_end(args[0])
    q, k, v, mask = args
    tile = attrs.get("tile_kvh", 0)
    kvh = attrs["kv_head"]
    if not tile or tile >= kvh:
        return _attention(attrs, q, k, v, mask)
    group = q.shape[2] // kvh
    parts = []
    for h in range(0, kvh, tile):
        sub = {**attrs, "kv_head": min(tile, kvh - h)}
        qs = np.ascontiguousarray(q[:, :, h * group : (h + tile) * group])
        ks, vs = np.ascontiguousarray(k[:, :, h : h + tile]), np.ascontiguousarray(v[:, :, h : h + tile])
        parts.append(_attention(sub, qs, ks, vs, mask))
    return np.concatenate(parts, axis=-1)


@kernel("GatedDeltaRule")
def gated_delta_rule(attrs: dict[str, Any], q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                     beta: np.ndarray, state: np.ndarray | None = None) -> np.ndarray:
    """The spec, or with `tile_vh` (set by the layer-group pass) the spec on each block of that many value
    heads with their key heads and state, every block made contiguous as the device loads it: the
    device's commands (one per block) and this whole-op call compute the same arrays, so the same bits."""
    tile, heads = attrs.get("tile_vh", 0), v.shape[2]
    if not tile or tile >= heads:
        return delta_rule_spec(attrs, q, k, v, g, beta, *(() if state is None else (state,)))
    parts = []
    for h in range(0, heads, tile):
        c = min(tile, heads - h)
        k0, kc = head_block(heads, q.shape[2], h, c)
        args = [np.ascontiguousarray(x[:, :, k0 : k0 + kc]) for x in (q, k)]
        args += [np.ascontiguousarray(x[:, :, h : h + c]) for x in (v, g, beta)]
        if state is not None:
            args.append(np.ascontiguousarray(state[:, h : h + c]))
        parts.append(delta_rule_spec(attrs, *args))
    return np.concatenate(parts, axis=2)


def attention_query_rows(attrs: dict[str, Any], heads: int, queries: int, keys: int) -> int:
    """Query rows per block of the kernel: `tile_q`, else all rows with key blocks, else a bounded block."""
    if attrs.get("tile_q"):
        return min(int(attrs["tile_q"]), queries)
    if attrs.get("tile_k"):
        return queries
    return max(1, min(queries, ATTENTION_BLOCK_SCORES // max(1, heads * keys)))


def _attention(attrs: dict[str, Any], q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Every query block of one group of KV heads (q [B, mq, heads, d], k/v [B, mk, kvh, d])."""
    b, mq, qh, d = q.shape
    mk = k.shape[1]
    tq = attention_query_rows(attrs, qh, mq, mk)
    tk = int(attrs.get("tile_k", 0) or 0)
    active = min(mq, attrs.get("active_rows") or mq)
    whole = tq >= mq and active >= mq
    out = np.empty((b, mq, qh * d), dtype=q.dtype) if whole else lazy_zeros.zeros((b, mq, qh * d), q.dtype)

    def rows(r: int) -> None:
        qs = np.ascontiguousarray(q[:, r : r + tq])
        ms = np.ascontiguousarray(mask[:, :, r : r + tq])
        if tk:
            state = None
            for s in range(0, mk, tk):
                state = flash_block(attrs, qs, k[:, s : s + tk], v[:, s : s + tk], ms[..., s : s + tk], state)
            out[:, r : r + tq] = flash_end(state)  # type: ignore[arg-type]
        else:
            out[:, r : r + tq] = _softmax_attention(attrs, qs, k, v, ms)

    # Query blocks are independent and each is computed whole by one thread: the same bits on any number.
    tile_map(rows, range(0, active, tq))
    return out


def _grouped(q: np.ndarray, kvh: int) -> np.ndarray:
    """q [B, rows, heads, d] -> [B, kvh, group, rows, d]: no repeated copy of K/V per query head."""
    b, rows, qh, d = q.shape
    return q.transpose(0, 2, 1, 3).reshape(b, kvh, qh // kvh, rows, d)


def _ungrouped(out: np.ndarray) -> np.ndarray:
    """[B, kvh, group, rows, d] -> [B, rows, heads * d], head h = kv * group + g."""
    b, kvh, group, rows, d = out.shape
    return out.reshape(b, kvh * group, rows, d).transpose(0, 2, 1, 3).reshape(b, rows, kvh * group * d)


def _softmax_attention(attrs: dict[str, Any], q: np.ndarray, k: np.ndarray, v: np.ndarray,
                       mask: np.ndarray) -> np.ndarray:
    kvh = k.shape[2]
    kt = k.transpose(0, 2, 3, 1)  # [B, kvh, d, mk]
    scores = np.matmul(_grouped(q, kvh), kt[:, :, None]) * q.dtype.type(attrs["scale"])
    scores = scores + mask[:, :, None]  # mask [B, 1, rows, mk] -> [B, 1, 1, rows, mk]
    probs = softmax(scores, axis=-1)
    return _ungrouped(np.matmul(probs, v.transpose(0, 2, 1, 3)[:, :, None]))


def flash_block(attrs: dict[str, Any], q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
                state: np.ndarray | None = None) -> np.ndarray:
    """One key block of the online softmax for one block of query rows, in q's dtype (f32 on the device).

    q [B, rows, heads, d], k/v [B, keys, kvh, d], mask [B, 1, rows, keys]; `state` [B, kvh, group, rows,
    d + 2] holds the accumulator (d values), the running max and the running sum of every query row, as
    local memory keeps it between blocks; None for the first block (a zero accumulator and sum, whose
    rescaling by exp(-inf) would add exactly nothing). Returns the new state. A key block the mask hides
    (-9984) contributes exactly nothing once a visible key was seen: exp underflows to 0 and the rescale
    factor is exp(0) = 1.
    """
    q, k, v, mask = (np.ascontiguousarray(x) for x in (q, k, v, mask))
    kvh, d = k.shape[2], q.shape[3]
    scores = np.matmul(_grouped(q, kvh), k.transpose(0, 2, 3, 1)[:, :, None]) * q.dtype.type(attrs["scale"])
    scores += mask[:, :, None]
    top = scores.max(axis=-1)
    if state is not None:
        top = np.maximum(state[..., d], top)
    scores -= top[..., None]
    p = np.exp(scores, out=scores)
    total = p.sum(axis=-1)
    pv = np.matmul(p, v.transpose(0, 2, 1, 3)[:, :, None])  # [B, kvh, group, rows, d]
    new = np.empty((*top.shape, d + 2), dtype=q.dtype)
    if state is None:
        new[..., :d] = pv
        new[..., d + 1] = total
    else:
        alpha = np.exp(state[..., d] - top)
        new[..., :d] = state[..., :d] * alpha[..., None] + pv
        new[..., d + 1] = state[..., d + 1] * alpha + total
    new[..., d] = top
    return new


def flash_end(state: np.ndarray) -> np.ndarray:
    """The output rows [B, rows, heads * d] of a finished online softmax: accumulator / sum."""
    d = state.shape[-1] - 2
    return _ungrouped(state[..., :d] / state[..., d + 1 :])


KERNELS = host_kernels(OPS)

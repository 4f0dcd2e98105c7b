"""The semantics of every op, in numpy. Keys are op names without the dialect prefix.

A kernel takes its operands (arrays, already in the compute dtype: float64 for the reference, float32 on
the device) and a dict of plain attributes, and returns the result in the same compute dtype. Rounding
to the stored element type is the caller's business (see llmbuild.numerics.formats.round_to).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from llmbuild.numerics.parallel import tile_map

Kernel = Callable[..., np.ndarray]
KERNELS: dict[str, Kernel] = {}


def kernel(name: str) -> Callable[[Kernel], Kernel]:
    def register(fn: Kernel) -> Kernel:
        KERNELS[name] = fn
        return fn

    return register


@kernel("Gather")
def gather(attrs: dict[str, Any], table: np.ndarray, indices: np.ndarray) -> np.ndarray:
    idx = np.asarray(indices).astype(np.int64)
    n = table.shape[attrs["axis"]]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"Gather index out of range [0, {n}): {idx.min()}..{idx.max()}")
    return np.take(table, idx, axis=attrs["axis"])


@kernel("RMSNorm")
def rms_norm(attrs: dict[str, Any], x: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    var = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(var + x.dtype.type(attrs["eps"])) * gamma


# Rows per tile of a product the layer-group pass did not tile by rows: a fixed size, so that the tiles,
# and with them the bits, do not depend on how many threads run them (numerics/parallel.py).
ROW_TILE = 32


def tiled_product(attrs: dict[str, Any], x: np.ndarray, w_nk: np.ndarray) -> np.ndarray:
    """`x @ w_nk^T`, computed tile by tile.

    `tile_m` (rows of x) and `tile_n` (rows of the [N, K] weight) are the op's tiles in local memory when
    the layer-group pass tiled it; otherwise tiles of ROW_TILE rows and the whole N. The chip accumulates
    each output over the whole K in one order whatever the tiling; BLAS does not (its blocking depends on
    M, N and its thread count), so both executors compute exactly these tiles, each one single-threaded
    product: the device's tile-by-tile run and the host's whole-op run then agree bit for bit, on any
    number of threads.
    """
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    m, n = x2.shape[0], w_nk.shape[0]
    tm, tn = attrs.get("tile_m", 0) or ROW_TILE, attrs.get("tile_n", 0) or n
    if m <= tm and n <= tn:
        return x @ w_nk.T
    out = np.empty((m, n), dtype=np.result_type(x2, w_nk))
    cols = [np.ascontiguousarray(w_nk[c : c + tn]).T for c in range(0, n, tn)] if tn < n else [w_nk.T]

    def tile(rc: tuple[int, int]) -> None:
        r, j = rc
        out[r : r + tm, j * tn : j * tn + tn] = np.ascontiguousarray(x2[r : r + tm]) @ cols[j]

    tiles = [(r, j) for r in range(0, m, tm) for j in range(len(cols))]
    if m == 1:  # a matrix-vector product: BLAS's own threads give the same bits (blas.py); no pool overhead
        for t in tiles:
            tile(t)
    else:
        tile_map(tile, tiles)
    return out.reshape(*lead, n)


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


def _dequantize(attrs: dict[str, Any], weight: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    levels = unpack_nibbles(weight) if attrs.get("packed") else weight
    g = attrs["q_group_size"]
    w = (levels.astype(scale.dtype) - np.repeat(zp, g, axis=1).astype(scale.dtype)) * np.repeat(scale, g, axis=1)
    if attrs.get("dequant_dtype"):
        from llmbuild.numerics.formats import round_to

        w = round_to(w.astype(np.float32), attrs["dequant_dtype"])
    return w


@kernel("A16MatMul")
def a16_matmul(
    attrs: dict[str, Any], x: np.ndarray, weight: np.ndarray, scale: np.ndarray, zp: np.ndarray,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    # copy=False: the cached dequantized weight is already in x's dtype on both executors; a plain astype
    # copied the whole matrix on every call (what made the host's w4 decode slower than bf16).
    y = tiled_product(attrs, x, dequantize(attrs, weight, scale, zp).astype(x.dtype, copy=False))
    return y if bias is None else y + bias


@kernel("A16Gather")
def a16_gather(
    attrs: dict[str, Any], weight: np.ndarray, scale: np.ndarray, zp: np.ndarray, indices: np.ndarray
) -> np.ndarray:
    # Only the looked-up rows are dequantized: a 49k-row table is never expanded for a few tokens.
    idx = np.asarray(indices).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= weight.shape[0]):
        raise IndexError(f"A16Gather index out of range [0, {weight.shape[0]}): {idx.min()}..{idx.max()}")
    flat = idx.reshape(-1)
    rows = _dequantize(attrs, weight[flat], scale[flat], zp[flat])
    return rows.reshape(idx.shape + rows.shape[-1:])


@kernel("Reshape")
def reshape(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return x.reshape(attrs["shape"])


@kernel("Permute")
def permute(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.transpose(x, attrs["order"]))


def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


@kernel("Rope")
def rope(attrs: dict[str, Any], x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    return x * cos + rotate_half(x) * sin


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


@kernel("FAttention")
def fattention(
    attrs: dict[str, Any], q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    """`tile_kvh` (set by the layer-group pass): computed in blocks of that many KV heads (with their query
    heads), as local memory holds them; each block is contiguous, as the device reads it."""
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


def _attention(attrs: dict[str, Any], q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    b, mq, qh, d = q.shape
    group = qh // attrs["kv_head"]
    # [B, kvh, group, mq, d] x [B, kvh, mk, d]: no repeated copy of K/V per query head.
    qg = q.transpose(0, 2, 1, 3).reshape(b, attrs["kv_head"], group, mq, d)
    kt = k.transpose(0, 2, 3, 1)  # [B, kvh, d, mk]
    scores = np.matmul(qg, kt[:, :, None]) * q.dtype.type(attrs["scale"])
    scores = scores + mask[:, :, None]  # mask [B, 1, mq, mk] -> [B, 1, 1, mq, mk]
    probs = softmax(scores, axis=-1)
    out = np.matmul(probs, v.transpose(0, 2, 1, 3)[:, :, None])  # [B, kvh, group, mq, d]
    return out.reshape(b, qh, mq, d).transpose(0, 2, 1, 3).reshape(b, mq, qh * d)


@kernel("Concat")
def concat(attrs: dict[str, Any], *xs: np.ndarray) -> np.ndarray:
    return np.concatenate(xs, axis=attrs["axis"])


@kernel("Add")
def add(attrs: dict[str, Any], *xs: np.ndarray) -> np.ndarray:
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out


@kernel("Mul")
def mul(attrs: dict[str, Any], *xs: np.ndarray) -> np.ndarray:
    out = xs[0]
    for x in xs[1:]:
        out = out * x
    return out


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


@kernel("SiLU")
def silu_kernel(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return silu(x)


@kernel("Active")
def active(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    if attrs["mode"] != "SILU":
        raise NotImplementedError(f"Active mode {attrs['mode']}")
    return silu(x)


@kernel("Softmax")
def softmax_kernel(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return softmax(x, attrs["axis"])


@kernel("Cast")
def cast(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return x  # the conversion is the rounding to the result type, done by the caller

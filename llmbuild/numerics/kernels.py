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

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from llmbuild.numerics import attention_rows, lazy_zeros
from llmbuild.numerics.dequantize import DequantizedRows, dequantize, dequantize_values
from llmbuild.numerics.formats import mask_value
from llmbuild.numerics.parallel import tile_map
from llmbuild.numerics.stored import RowReader, Weight, is_lazy, take_rows
from llmbuild.numerics.weight_product import plus_bias, tiled_product
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


@kernel("MatMul")
def matmul(attrs: dict[str, Any], x: np.ndarray, right: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    if attrs["right_transpose"]:
        y = plus_bias(attrs, tiled_product(attrs, x, right), bias)
    elif bias is not None:
        y = x @ right + bias
    else:
        y = x @ right
    if attrs.get("do_relu"):
        y = np.maximum(y, 0)
    return y


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
    return plus_bias(attrs, y, bias)


@kernel("A16Gather")
def a16_gather(
    attrs: dict[str, Any], weight: Weight, scale: Weight, zp: Weight, indices: np.ndarray
) -> np.ndarray:
    # Only the looked-up rows are dequantized: a 49k-row table is never expanded for a few tokens.
    idx = np.asarray(indices).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= weight.shape[0]):
        raise IndexError(f"A16Gather index out of range [0, {weight.shape[0]}): {idx.min()}..{idx.max()}")
    flat = idx.reshape(-1)
    rows = dequantize_values(attrs, take_rows(weight, flat), take_rows(scale, flat), take_rows(zp, flat))
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
    `hidden_key_blocks: "skip"` (set by the host path, never in the IR): a key block the mask hides from
    every real row of a query block is not computed. Its contribution to those rows is exactly nothing
    (`flash_block`: exp underflows to 0 and the rescale is exactly 1, or, before the first visible key,
    the hidden blocks' state is scaled by exactly 0), so their bits are the device's, which computes every
    block; what it saves is a prefill of a few tokens in a long net (the keys past the prompt) and a
    continued conversation's new rows past its history.

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

    # In the products' defined arithmetic (float32) a row's bits are its own: the flash blocks compute the
    # real rows alone (attention_rows.py); BLAS's bits for a row depend on the rows beside it.
    exact = attention_rows.supported(q, k, v, mask)

    def rows(r: int) -> None:
        qs = np.ascontiguousarray(q[:, r : r + tq])
        ms = np.ascontiguousarray(mask[:, :, r : r + tq])
        if tk:
            n = min(tq, active - r) if exact else tq
            qs, ms_rows = qs[:, :n], ms[:, :, :n]
            state = None
            for s in _key_blocks(attrs, ms[:, :, : active - r], mk, tk):
                state = flash_block(attrs, qs, k[:, s : s + tk], v[:, s : s + tk], ms_rows[..., s : s + tk], state)
            out[:, r : r + n] = flash_end(state)  # type: ignore[arg-type]
        else:
            out[:, r : r + tq] = _softmax_attention(attrs, qs, k, v, ms, active - r)

    # Query blocks are independent and each is computed whole by one thread: the same bits on any number.
    tile_map(rows, range(0, active, tq))
    return out


def _key_blocks(attrs: dict[str, Any], real: np.ndarray, keys: int, tk: int) -> list[int]:
    """The starts of the key blocks a query block computes: all of them, or with `hidden_key_blocks: "skip"`
    those the mask of its real rows (`real`) does not hide whole (all of them if it hides every one)."""
    starts = list(range(0, keys, tk))
    if attrs.get("hidden_key_blocks") != "skip":
        return starts
    hidden = real.dtype.type(mask_value(""))
    seen = [s for s in starts if not (real[..., s : s + tk] == hidden).all()]
    return seen or starts


def _grouped(q: np.ndarray, kvh: int) -> np.ndarray:
    """q [B, rows, heads, d] -> [B, kvh, group, rows, d]: no repeated copy of K/V per query head."""
    b, rows, qh, d = q.shape
    return q.transpose(0, 2, 1, 3).reshape(b, kvh, qh // kvh, rows, d)


def _ungrouped(out: np.ndarray) -> np.ndarray:
    """[B, kvh, group, rows, d] -> [B, rows, heads * d], head h = kv * group + g."""
    b, kvh, group, rows, d = out.shape
    return out.reshape(b, kvh * group, rows, d).transpose(0, 2, 1, 3).reshape(b, rows, kvh * group * d)


def _softmax_attention(attrs: dict[str, Any], q: np.ndarray, k: np.ndarray, v: np.ndarray,
                       mask: np.ndarray, real: int | None = None) -> np.ndarray:
    """`real`: the query rows whose outputs are read (the rest are a prefill's padding). A block of several
    query rows in float32 (every executor's but the float64 reference) runs as one key block of
    `flash_block`, whose products there are numerics/attention_rows.py's: their bits for a row do not depend
    on the other rows or on the keys the mask hides, so it computes the real rows alone. A block of one row
    (a decode step's) takes the same arithmetic through `attention_rows.decode_row`, which reads the keys
    its mask shows where they lie: its cost follows the history, not the net's length (BLAS over every key
    of a 1.5B's 2048-key step took 0.9-1.1 ms a layer at any history, this 0.08-0.09 ms at 40 keys and
    0.60-0.65 ms with the cache full: benchmarks/attention_paths.py), and its bits are those of the
    prefill's row and of any CPU (BLAS's were its kernels' for the CPU).
    The float64 reference runs both products on every row with numpy.
    The softmax between them is numpy's, row by row, so it runs on the real rows only, in place (the same
    values as `op_defs.softmax`), and the padding rows' weights are zeros, which change no other row's sums."""
    if attention_rows.supported(q, k, v, mask):
        if q.shape[:2] == (1, 1) and real != 0:  # a decode step: its keys read where they lie, the same bits
            return attention_rows.decode_row(q, k, v, mask, q.dtype.type(attrs["scale"]))
        # One key block over every key: the same softmax, in the defined arithmetic (flash_block).
        rows = q.shape[1] if real is None else max(0, min(real, q.shape[1]))
        out = np.zeros((q.shape[0], q.shape[1], q.shape[2] * q.shape[3]), dtype=q.dtype)
        if rows:
            out[:, :rows] = flash_end(flash_block(attrs, q[:, :rows], k, v, mask[:, :, :rows]))
        return out
    kvh = k.shape[2]
    kt = k.transpose(0, 2, 3, 1)  # [B, kvh, d, mk]
    scores = np.matmul(_grouped(q, kvh), kt[:, :, None])  # [B, kvh, group, rows, mk]
    rows = scores.shape[-2] if real is None else max(0, min(real, scores.shape[-2]))
    part = scores[..., :rows, :]
    part *= q.dtype.type(attrs["scale"])
    part += mask[:, :, None, :rows]  # mask [B, 1, rows, mk] -> [B, 1, 1, rows, mk]
    part -= np.max(part, axis=-1, keepdims=True)
    np.exp(part, out=part)
    part /= np.sum(part, axis=-1, keepdims=True)
    scores[..., rows:, :] = 0
    return _ungrouped(np.matmul(scores, v.transpose(0, 2, 1, 3)[:, :, None]))


def flash_block(attrs: dict[str, Any], q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
                state: np.ndarray | None = None) -> np.ndarray:
    """One key block of the online softmax for one block of query rows, in q's dtype (f32 on the device).

    q [B, rows, heads, d], k/v [B, keys, kvh, d], mask [B, 1, rows, keys]; `state` [B, kvh, group, rows,
    d + 2] holds the accumulator (d values), the running max and the running sum of every query row, as
    local memory keeps it between blocks; None for the first block (a zero accumulator and sum, whose
    rescaling by exp(-inf) would add exactly nothing). Returns the new state. Float32 operands take the
    products' defined arithmetic (attention_rows.scores and weighted_values, whose bits for a row are that
    row's alone, the block's sum of weights included); the float64 reference numpy's. A key block the mask hides
    (-9984) contributes exactly nothing once a visible key was seen: exp underflows to 0 and the rescale
    factor is exp(0) = 1.
    """
    q, k, v, mask = (np.ascontiguousarray(x) for x in (q, k, v, mask))
    kvh, d = k.shape[2], q.shape[3]
    exact = attention_rows.supported(q, k, v, mask)  # float32: each row's bits its own (attention_rows.py)
    if exact:
        if q.shape[0] == 1:  # the block's keys these rows see: the rest add exact zeros (visible_keys)
            kept = attention_rows.visible_keys(mask[0, 0])
            k, v, mask = k[:, kept], v[:, kept], mask[..., kept]
        scores = attention_rows.scores(q, k) * q.dtype.type(attrs["scale"])
    else:
        scores = np.matmul(_grouped(q, kvh), k.transpose(0, 2, 3, 1)[:, :, None]) * q.dtype.type(attrs["scale"])
    scores += mask[:, :, None]
    top = scores.max(axis=-1)
    if state is not None:
        top = np.maximum(state[..., d], top)
    scores -= top[..., None]
    p = np.exp(scores, out=scores)
    if exact:
        pv, total = attention_rows.weighted_values(p, v)
    else:
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

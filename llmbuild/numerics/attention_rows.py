"""Attention's products in the products' defined arithmetic, for float32 operands (numerics/kernels.py's
`flash_block`, which the one-softmax path runs as a single key block, calls these).

Both products are numerics/vector_product.py's arithmetic (64 lanes, each summing in k order, then the
fixed tree), computed by matrix_product's kernel: the scores q·kᵀ (one sum over d each), then the weights
p times [vᵀ; 1], which gives each row's weighted values and, in its last column, the sum of its weights
(the output is the one divided by the other, `kernels.flash_end`). So a query row's output depends on that
row alone, never on how many rows are computed beside it, and not on the keys its mask hides: a hidden
key's weight underflows to exactly +0, its terms are zeros (its values are finite: the cache's empty slots
hold zeros or an earlier turn's rows), and in that arithmetic a lane's sum, which starts at +0 and so is
never -0, is unchanged by adding a zero. A prefill therefore computes its real query rows only, against the
keys they see (`visible_keys`), and gets the bits of the device, which computes every row of the static net
against every key. With BLAS (whose bits for a row depend on how many rows one call multiplies) the host
had to compute the padding rows too: 128 query rows and keys for SmolLM2's 37-token prompt, 0.9 ms a layer.
"""

from __future__ import annotations

import numpy as np

from llmbuild.numerics import decode_scores, matrix_product, weighted_lanes
from llmbuild.numerics.addresses import address
from llmbuild.numerics.formats import mask_value
from llmbuild.numerics.vector_product import LANES


def supported(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> bool:
    """Whether these operands take this arithmetic: float32 (the device's attention); the float64 reference
    keeps numpy's products."""
    return all(a.dtype == np.float32 for a in (q, k, v, mask)) and q.shape[2] % k.shape[2] == 0


def visible_keys(mask: np.ndarray) -> slice | np.ndarray:
    """The keys computed for the rows of `mask` [rows, keys], in order: those up to the last one some row
    sees, less every block of 64 (a block of lanes) the mask hides from every row; every key if it hides all.
    A hidden block's terms are zeros in every lane, so leaving it out moves no later key to another lane and
    changes no sum, and each kept block but the last is whole, so the kept keys keep their lanes (a decode
    step's keys: the history's blocks and the new row, not the empty cache between them)."""
    runs = visible_runs(mask)
    if len(runs) == 1 and runs[0][0] == 0:  # a prefix of the blocks: a slice, no copy
        return slice(*runs[0])
    return _keys_of(runs)


def visible_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """`visible_keys` as runs of keys [start, stop) in order: a decode step's keys are read where they lie
    (the history's blocks, then the new row's), not gathered into a copy. `mask`: [rows, keys] or one row."""
    keys = mask.shape[-1]
    shown = mask != mask.dtype.type(mask_value(""))
    shown = np.flatnonzero(shown.any(axis=0) if shown.ndim > 1 and shown.shape[0] > 1 else shown.reshape(-1))
    if shown.size == 0:
        return [(0, keys)]
    end = int(shown[-1]) + 1  # the keys after the last one shown: a suffix of zero terms
    blocks = shown // LANES  # ascending
    blocks = blocks[np.concatenate(([True], blocks[1:] != blocks[:-1]))]
    breaks = np.flatnonzero(blocks[1:] != blocks[:-1] + 1)
    firsts = blocks[np.concatenate(([0], breaks + 1))].tolist()
    lasts = blocks[np.concatenate((breaks, [blocks.size - 1]))].tolist()
    return [(first * LANES, min((last + 1) * LANES, end)) for first, last in zip(firsts, lasts, strict=True)]


def _keys_of(runs: list[tuple[int, int]]) -> np.ndarray:
    return np.concatenate([np.arange(start, stop) for start, stop in runs])


# Up to this many keys in several runs, a decode step gathers them into one copy: a call a KV head for each
# product instead of one a run and head. SmolLM2's step at a history of 40 keys (65 kept) 0.076 against 0.093
# ms; at 150 keys (193 kept) the reads in place are level or quicker for SmolLM2, the 1.5B and the 7B (0.097
# against 0.104, 0.137 against 0.171, 0.277 against 0.351 ms; one thread, decode_row on random operands).
GATHERED_KEYS = 128


def decode_row(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: np.float32) -> np.ndarray:
    """One query row's attention, q [1, 1, heads, d] over k/v [1, keys, kv_heads, d] (float32, contiguous)
    and mask [1, 1, 1, keys]: [1, 1, heads * d], the bits of `flash_end(flash_block(...))` (kernels.py) on
    the same operands: the same products on the same keys (the visible runs in place of a gathered copy),
    then the same float32 steps in the same order. Where the kernels take d and the group (decode_scores.py,
    weighted_lanes.weighted_row), three compiled calls and three numpy steps for every head of the layer;
    else numpy and a kernel call a KV head and run (tests/test_decode_scores.py: the same bits)."""
    kv_heads, d = k.shape[2], k.shape[3]
    group = q.shape[2] // kv_heads
    row = mask[0, 0, 0]
    if (decode_scores.available(d) and weighted_lanes.row_available(group, d)
            and all(a.flags.c_contiguous for a in (q, k, v, row))):
        # Compiled: the runs, the scores (scaled and masked), and the value product with its division, each
        # one call for every head; numpy's softmax steps between them on the packed scores, as below.
        found = decode_scores.runs(row, mask_value(""))
        weights = decode_scores.scores(q[0, 0], k[0], found, row, scale)
        _numerators(weights)
        return weighted_lanes.weighted_row(weights, v[0], found)
    runs = visible_runs(row)
    keys = sum(stop - start for start, stop in runs)
    if len(runs) > 1 and keys <= GATHERED_KEYS:  # a short history: one copy is cheaper than a call per run
        kept = _keys_of(runs)
        k, v, mask = k[:, kept], v[:, kept], mask[..., kept]
        runs = [(0, keys)]
    queries = q.reshape(kv_heads, group, d)
    scores = np.empty((kv_heads, group, keys), dtype=np.float32)
    shown = np.empty(keys, dtype=np.float32)
    at = 0
    for start, stop in runs:
        for h in range(kv_heads):
            _product(queries[h], k[0, start:stop, h], scores[h, :, at : at + stop - start])
        shown[at : at + stop - start] = mask[0, 0, 0, start:stop]
        at += stop - start
    scores *= scale
    scores += shown
    _numerators(scores)
    # The value product's lanes from the values where they lie (weighted_lanes.py): weighted_values' bits
    # without its transposed copy of v.
    lanes = weighted_lanes.lanes_for(kv_heads, group, d)
    at = 0
    for start, stop in runs:
        weighted_lanes.accumulate(scores[..., at : at + stop - start], v[0, start:stop], at, lanes)
        at += stop - start
    sums = weighted_lanes.summed(lanes)  # the values' sums, then the weights' in column d
    return (sums[..., :d] / sums[..., d : d + 1]).reshape(1, 1, kv_heads * group * d)


def _numerators(scores: np.ndarray) -> None:
    """A decode row's softmax numerators in place: less each row's maximum, then exp, on the whole packed
    array, as flash_block's (numpy's exp loop is the same); both of decode_row's paths take these steps."""
    scores -= scores.max(axis=-1)[..., None]
    np.exp(scores, out=scores)


def scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """q·kᵀ of every query head against its KV head: q [B, rows, heads, d], k [B, keys, kv_heads, d] ->
    [B, kv_heads, group, rows, keys] (the layout of `kernels.flash_block`), one sum over d each."""
    b, rows, heads, d = q.shape
    keys, kv_heads = k.shape[1], k.shape[2]
    group = heads // kv_heads
    out = np.empty((b, kv_heads, group * rows, keys), dtype=np.float32)
    for i in range(b):
        queries = np.ascontiguousarray(q[i].transpose(1, 0, 2)).reshape(kv_heads, group * rows, d)
        for h in range(kv_heads):
            _product(queries[h], k[i, :, h], out[i, h])
    return out.reshape(b, kv_heads, group, rows, keys)


def weighted_values(p: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p·v, the sum of p's row) for weights p [B, kv_heads, group, rows, keys] and v [B, keys, kv_heads, d]:
    [B, kv_heads, group, rows, d] and [B, kv_heads, group, rows], by one product with [vᵀ; 1]."""
    b, kv_heads, group, rows, keys = p.shape
    d = v.shape[3]
    width = -(-keys // LANES) * LANES
    weights = np.zeros((b, kv_heads, group * rows, width), dtype=np.float32)
    weights[..., :keys] = p.reshape(b, kv_heads, group * rows, keys)
    values_and_one = np.zeros((b, kv_heads, d + 1, width), dtype=np.float32)
    for i in range(b):
        # A lane block of keys at a time: numpy's transposing copy of the whole v strides through memory a
        # key row apart and ran 10x slower (8.1 against 0.8 ms for 4096 keys of a 1.5B's layer).
        for s in range(0, keys, LANES):
            e = min(s + LANES, keys)
            values_and_one[i, :, :d, s:e] = v[i, s:e].transpose(1, 2, 0)
    values_and_one[:, :, d, :keys] = 1.0
    summed = np.empty((b, kv_heads, group * rows, d + 1), dtype=np.float32)
    for i in range(b):
        for h in range(kv_heads):
            _product(weights[i, h], values_and_one[i, h], summed[i, h])
    summed = summed.reshape(b, kv_heads, group, rows, d + 1)
    return summed[..., :d], summed[..., d]


def _product(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out = x times wᵀ in the defined arithmetic: a small one straight into the compiled kernel (for a short
    prompt the checks of `matrix_product.product` cost more than its work), else by it (threads, padding)."""
    m, k = x.shape
    n = w.shape[0]
    run = matrix_product.kernel("f32")
    if (run is None or k % LANES or m * n * k >= matrix_product.PARALLEL_MACS or not x.flags.c_contiguous
            or w.strides[1] != 4 or out.strides[1] != 4):
        matrix_product.product(x, w, out)
        return
    run(address(x), k, m, address(w), w.strides[0], address(out), out.strides[0] // 4, 0, n, k)

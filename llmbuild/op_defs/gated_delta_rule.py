"""GatedDeltaRule: linear attention by the gated delta rule (Gated DeltaNet), over one call's tokens from
a carried recurrent state, giving each token's output and the state after the last token.

Per value head h (query/key head h // (Hv / Hk)), with the state S [dk, dv] and for each token t:

    S = S * exp(g_t);  S = S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T (scale q_t)

`chunk_size` 1 computes exactly that, token by token (a decode step); a larger chunk computes the same
recurrence a chunk of tokens at a time (the intra-chunk part as a unit lower-triangular system solved by
forward substitution, then one state update per chunk), as transformers' torch_chunk_gated_delta_rule does
for a prompt. The result is one tensor [1, dk + n, Hv, dv] (an op has one result here), which two Slices
split: first the final state as dk rows of [Hv, dv] (S[h, i, :] at row i, head h), then each token's
output, so that the tokens are the last rows, the padding of a partly filled prefill at the very end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef


def work(tokens: int, value_heads: int, key_dim: int, value_dim: int, chunk: int) -> tuple[float, float]:
    """(MAC-array flops, vector operations) of one call, as the spec computes it. Token by token (chunk 1)
    it is vector work on the [dk, dv] state of each head (decay, read, write, output: 7 operations an
    element). A chunk of c tokens (padded to whole chunks) is products: the chunk's k k^T and q k^T
    (2 c^2 dk each), the triangular solve over [v, k] (c^2 (dv + dk)), reading the state for v and q (2 c dk dv
    each), the intra-chunk output (2 c^2 dv) and the state's update (2 c dk dv); the decays are vector work."""
    if chunk == 1:
        return 0.0, float(tokens * value_heads * (7 * key_dim * value_dim + 4 * value_dim))
    c = chunk
    chunks = -(-tokens // c)
    per_chunk = (4 * c * c * key_dim + c * c * (value_dim + key_dim) + 6 * c * key_dim * value_dim
                 + 2 * c * c * value_dim)
    vector = 4 * c * c + 2 * c * (key_dim + value_dim) + 2 * key_dim * value_dim  # decays, masks, the state's
    return float(chunks * value_heads * per_chunk), float(chunks * value_heads * vector)


def _recurrent(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
               state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token by token, in transformers' torch_recurrent_gated_delta_rule's order of operations. Heads first:
    q, k [Hv, n, dk], v [Hv, n, dv], g, beta [Hv, n], state [Hv, dk, dv]."""
    out = np.zeros_like(v)
    for t in range(q.shape[1]):
        state = state * np.exp(g[:, t])[:, None, None]
        kv_mem = (state * k[:, t, :, None]).sum(axis=-2)
        delta = (v[:, t] - kv_mem) * beta[:, t, None]
        state = state + k[:, t, :, None] * delta[:, None, :]
        out[:, t] = (state * q[:, t, :, None]).sum(axis=-2)
    return out, state


def _chunked(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray,
             chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """A chunk of tokens at a time, in transformers' torch_chunk_gated_delta_rule's order (tokens padded to
    whole chunks with zeros, which change neither the real rows nor the state)."""
    heads, n = q.shape[:2]
    total = -(-n // chunk) * chunk
    if total != n:
        pad = ((0, 0), (0, total - n))
        q, k, v = (np.pad(x, (*pad, (0, 0))) for x in (q, k, v))
        g, beta = np.pad(g, pad), np.pad(beta, pad)
    chunks = total // chunk

    def blocks(x: np.ndarray) -> np.ndarray:
        return x.reshape(heads, chunks, chunk, x.shape[-1])

    v_beta, k_beta = blocks(v * beta[..., None]), blocks(k * beta[..., None])
    q, k = blocks(q), blocks(k)
    cum = np.cumsum(g.reshape(heads, chunks, chunk), axis=-1)
    later = np.triu(np.ones((chunk, chunk), dtype=bool), 1)  # (i, j) with j after i: no decay path
    pair = np.exp(np.where(later, -np.inf, cum[..., :, None] - cum[..., None, :]))
    system = (k_beta @ k.swapaxes(-1, -2)) * pair
    intra = (q @ k.swapaxes(-1, -2)) * pair
    # Unit lower-triangular solve (the diagonal is 1): row i = rhs_i - sum_{j < i} system_ij row_j.
    solved = np.concatenate([v_beta, k_beta * np.exp(cum)[..., None]], axis=-1)
    for i in range(1, chunk):
        solved[..., i, :] -= np.einsum("hcj,hcjd->hcd", system[..., i, :i], solved[..., :i, :])
    dv = v.shape[-1]
    new_values, k_cumdecay = solved[..., :dv], solved[..., dv:]
    q = q * np.exp(cum)[..., None]
    k = k * np.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = np.exp(cum[..., -1])
    out = np.zeros_like(new_values)
    for c in range(chunks):
        v_new = new_values[:, c] - k_cumdecay[:, c] @ state
        out[:, c] = q[:, c] @ state + intra[:, c] @ v_new
        state = state * chunk_decay[:, c, None, None] + k[:, c].swapaxes(-1, -2) @ v_new
    return out.reshape(heads, total, dv)[:, :n], state


def spec(attrs: dict[str, Any], q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
         state: np.ndarray | None = None) -> np.ndarray:
    """q, k [1, n, Hk, dk] (unit rows), v [1, n, Hv, dv], g (log decay, <= 0) and beta [1, n, Hv], state
    [1, Hv, dk, dv] (zeros when absent) -> [1, dk + n, Hv, dv]: the final state's rows, then the outputs."""
    _, n, key_heads, dk = k.shape
    heads, dv = v.shape[2:]
    dt = q.dtype.type
    q, k = (np.repeat(x, heads // key_heads, axis=2)[0].transpose(1, 0, 2) for x in (q, k))
    q = q * dt(attrs["scale"])
    v = v[0].transpose(1, 0, 2)
    g, beta = g[0].T, beta[0].T
    s = np.zeros((heads, dk, dv), q.dtype) if state is None else state[0].astype(q.dtype)
    chunk = int(attrs["chunk_size"])
    out, s = _recurrent(q, k, v, g, beta, s) if chunk == 1 else _chunked(q, k, v, g, beta, s, chunk)
    return np.concatenate([s.transpose(1, 0, 2), out.transpose(1, 0, 2)])[None]


def head_block(value_heads: int, key_heads: int, start: int, count: int) -> tuple[int, int]:
    """(first key head, key heads) that value heads [start, start + count) read. A block is a whole number
    of key heads' groups or lies inside one group (`block_sizes`)."""
    group = value_heads // key_heads
    return start // group, max(1, count // group)


def block_sizes(value_heads: int, key_heads: int) -> list[int]:
    """Value heads per block that cut the heads evenly and keep every block on whole key heads or inside
    one key head's group (so its queries and keys are one contiguous slice), largest first."""
    group = value_heads // key_heads
    return [m for m in range(value_heads, 0, -1) if value_heads % m == 0 and (m % group == 0 or group % m == 0)]


GATED_DELTA_RULE = OpDef(
    "GatedDeltaRule", 22, "Linear attention by the gated delta rule from a carried state: the final state "
    "[Hv, dk, dv] as dk rows of [Hv, dv], then each token's output [n, Hv, dv]; chunk_size 1 goes token by "
    "token, a larger one a chunk at a time.",
    '%o = "tpu.GatedDeltaRule"(%q, %k, %v, %g, %beta, %s) {chunk_size = 64 : i64, scale = 0.25 : f64} : '
    "(...) -> tensor<1x32x4x16xf32>",
    shape="GatedDeltaRule", grouping="whole", cost="recurrence", spec=spec, exported=False,
)

"""The semantics of every op, in numpy. Keys are op names without the dialect prefix.

A kernel takes its operands (arrays, already in the compute dtype: float64 for the reference, float32 on
the device) and a dict of plain attributes, and returns the result in the same compute dtype. Rounding
to the stored element type is the caller's business (see llmbuild.numerics.formats.round_to).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

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


@kernel("MatMul")
def matmul(attrs: dict[str, Any], x: np.ndarray, right: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    w = right.T if attrs["right_transpose"] else right
    y = x @ w
    if bias is not None:
        y = y + bias
    if attrs.get("do_relu"):
        y = np.maximum(y, 0)
    return y


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

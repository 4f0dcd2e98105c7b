"""FAttention: grouped-query attention, as one exact softmax per query row."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef
from llmbuild.op_defs.softmax import softmax


def spec(attrs: dict[str, Any], q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """q [B, mq, q_head, d], k/v [B, mk, kv_head, d], mask [B, 1, mq, mk] -> [B, mq, q_head * d]; query
    head h reads KV head h // (q_head / kv_head). Tile attributes change the order of the sums, not this."""
    b, mq, qh, d = q.shape
    group = qh // k.shape[2]
    keys, values = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    heads_first = q.transpose(0, 2, 1, 3)  # [B, q_head, mq, d]
    scores = heads_first @ keys.transpose(0, 2, 3, 1) * q.dtype.type(attrs["scale"]) + mask  # [B, q_head, mq, mk]
    out = softmax(scores, -1) @ values.transpose(0, 2, 1, 3)  # [B, q_head, mq, d]
    return out.transpose(0, 2, 1, 3).reshape(b, mq, qh * d)


FATTENTION = OpDef(
    "FAttention", 7, "Grouped-query attention softmax(q k^T * scale + mask) v, in key blocks when long.",
    '%a = "tpu.FAttention"(%q, %k, %v, %mask) {scale = 0.25 : f64, q_head = 4 : i64, kv_head = 2 : i64} '
    ": (...) -> tensor<1x16x64xbf16>",
    shape="FAttention", grouping="attention", cost="attention", real_rows="skipping", spec=spec,
)

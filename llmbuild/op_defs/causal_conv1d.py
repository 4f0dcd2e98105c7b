"""CausalConv1d: a depthwise convolution along the tokens, each output row reading its own row and the
kernel's K - 1 rows before it (Gated DeltaNet's short convolution over q, k and v)."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef


def spec(attrs: dict[str, Any], x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """x [1, T, C] (the window's earlier rows first, or `pad` rows of zeros put before it), weight [C, 1, K]
    (torch's depthwise Conv1d layout) -> [1, T + pad - K + 1, C]: out[t, c] = sum_j x[t + j, c] * w[c, 0, j]."""
    pad, kernel = attrs["pad"], weight.shape[-1]
    if pad:
        x = np.concatenate([np.zeros((x.shape[0], pad, x.shape[2]), x.dtype), x], axis=1)
    rows = x.shape[1] - kernel + 1
    out = x[:, 0:rows] * weight[:, 0, 0]
    for j in range(1, kernel):
        out = out + x[:, j : j + rows] * weight[:, 0, j]
    return out


CAUSAL_CONV1D = OpDef(
    "CausalConv1d", 21, "A depthwise causal convolution along the tokens: out[t] = sum_j x[t + j] * w[:, 0, j] "
    "over a window whose first K - 1 rows are the carried state (or `pad` rows of zeros).",
    '%c = "tpu.CausalConv1d"(%x, %w) {pad = 0 : i64} : (tensor<1x19x128xbf16>, tensor<128x1x4xbf16>) -> '
    "tensor<1x16x128xbf16>",
    shape="CausalConv1d", grouping="whole", cost="vector",
    vector_ops=8,  # a multiply and an add per tap, K = 4
    spec=spec, exported=False,
)

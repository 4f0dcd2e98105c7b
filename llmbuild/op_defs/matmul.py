"""MatMul: x @ W (+ bias) over the last axis."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef


def spec(attrs: dict[str, Any], x: np.ndarray, right: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    w = np.asarray(right)
    y = x @ (w.T if attrs["right_transpose"] else w)
    if bias is not None:
        y = y + bias
    if attrs.get("do_relu"):
        y = np.maximum(y, 0)
    return y


MATMUL = OpDef(
    "MatMul", 3, "x @ W (+ bias) over the last axis; W is [K, N], or [N, K] transposed.",
    '%y = "tpu.MatMul"(%x, %w) {right_transpose = true} : (tensor<1x16x64xbf16>, tensor<128x64xbf16>) '
    "-> tensor<1x16x128xbf16>",
    shape="MatMul", grouping="row_local", cost="mac", real_rows="skipping", spec=spec,
)

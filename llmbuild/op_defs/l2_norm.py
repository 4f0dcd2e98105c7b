"""L2Norm: each row scaled to unit length over the last axis (Gated DeltaNet's query and key heads)."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef


def spec(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    # x * rsqrt(sum(x^2) + eps), as transformers' l2norm (and the FLA kernels it follows) computes it.
    total = np.sum(x * x, axis=-1, keepdims=True)
    return x * (x.dtype.type(1) / np.sqrt(total + x.dtype.type(attrs["eps"])))


L2_NORM = OpDef(
    "L2Norm", 20, "x * rsqrt(sum(x^2) + eps) over the last axis: a linear-attention head's query or key.",
    '%q = "tpu.L2Norm"(%x) {eps = 1.0e-06 : f64} : (tensor<1x16x2x16xbf16>) -> tensor<1x16x2x16xbf16>',
    shape="L2Norm", grouping="row_local", cost="vector", real_rows="local",
    vector_ops=4,  # square, accumulate, the row's rsqrt, scale
    spec=spec, exported=False,
)

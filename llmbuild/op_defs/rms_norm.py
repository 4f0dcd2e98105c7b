"""RMSNorm over the last axis."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef


def spec(attrs: dict[str, Any], x: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    var = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(var + x.dtype.type(attrs["eps"])) * gamma


RMS_NORM = OpDef(
    "RMSNorm", 2, "x / sqrt(mean(x^2) + eps) * gamma over the last axis.",
    '%y = "tpu.RMSNorm"(%x, %g) {eps = 1.0e-06 : f64} : (tensor<1x16x64xbf16>, tensor<64xbf16>) -> '
    "tensor<1x16x64xbf16>",
    shape="RMSNorm", grouping="row_local", cost="vector", real_rows="local",
    vector_ops=4,  # square, accumulate, scale by the row's rsqrt, multiply by gamma
    spec=spec,
)

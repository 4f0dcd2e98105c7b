"""LayerNorm over the last axis."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef
from llmbuild.op_defs.rms_norm import RMS_NORM


def spec(attrs: dict[str, Any], x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    centred = x - np.mean(x, axis=-1, keepdims=True)
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    return centred / np.sqrt(var + x.dtype.type(attrs["eps"])) * gamma + beta


LAYER_NORM = OpDef(
    "LayerNorm", 18, "(x - mean) / sqrt(var + eps) * gamma + beta over the last axis: the vision towers' norm.",
    '%y = "tpu.LayerNorm"(%x, %g, %b) {eps = 1.0e-06 : f64} : (tensor<1x1025x1024xbf16>, ...) -> '
    "tensor<1x1025x1024xbf16>",
    shape="LayerNorm", grouping="row_local", cost="vector", real_rows="local",
    vector_ops=RMS_NORM.vector_ops + 2,  # RMSNorm's work plus centring and the bias
    spec=spec,
)

"""Softmax over an axis."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def spec(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return softmax(x, attrs["axis"])


SOFTMAX = OpDef(
    "Softmax", 12, "softmax over an axis.",
    '%p = "tpu.Softmax"(%x) {axis = -1 : i64} : (tensor<1x4x16x64xf32>) -> tensor<1x4x16x64xf32>',
    shape="Softmax", grouping="whole", cost="vector",
    vector_ops=5,  # add mask, running max, subtract and exp, sum, normalise
    spec=spec,
)

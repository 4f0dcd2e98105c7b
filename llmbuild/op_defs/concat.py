"""Concat: tensors joined along an axis."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef


def spec(attrs: dict[str, Any], *xs: np.ndarray) -> np.ndarray:
    return np.concatenate(xs, axis=attrs["axis"])


CONCAT = OpDef(
    "Concat", 8, "Tensors joined along an axis: the KV history and the new rows.",
    '%k = "tpu.Concat"(%hk, %kn) {axis = 1 : i64} : (tensor<1x48x2x16xbf16>, tensor<1x16x2x16xbf16>) -> '
    "tensor<1x64x2x16xbf16>",
    shape="Concat", grouping="concat", cost="vector", vector_ops=1, spec=spec, moves_data=True,
)

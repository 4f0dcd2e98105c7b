"""Reshape: the same elements in another shape."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef


def spec(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return x.reshape(attrs["shape"])


RESHAPE = OpDef(
    "Reshape", 4, "The same elements in another shape (a view when assign-address aliases it).",
    '%r = "tpu.Reshape"(%x) {shape = array<i64: 1, 16, 4, 16>} : (tensor<1x16x64xbf16>) -> '
    "tensor<1x16x4x16xbf16>",
    shape="Reshape", grouping="row_local", cost="view", vector_ops=0, spec=spec, moves_data=True,
)

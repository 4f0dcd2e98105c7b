"""Permute: axes in another order."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef


def spec(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.transpose(x, attrs["order"]))


PERMUTE = OpDef(
    "Permute", 5, "Axes in another order.",
    '%p = "tpu.Permute"(%x) {order = array<i64: 0, 2, 1, 3>} : (tensor<1x16x4x16xbf16>) -> '
    "tensor<1x4x16x16xbf16>",
    shape="Permute", grouping="whole", cost="vector", vector_ops=1, spec=spec, moves_data=True,
)

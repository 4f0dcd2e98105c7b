"""Mul: elementwise product with broadcasting."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef


def spec(attrs: dict[str, Any], *xs: np.ndarray) -> np.ndarray:
    out = xs[0]
    for x in xs[1:]:
        out = out * x
    return out


MUL = OpDef(
    "Mul", 10, "Elementwise product with broadcasting: the gated MLP.",
    '%m = "tpu.Mul"(%a, %b) : (tensor<1x16x128xbf16>, tensor<1x16x128xbf16>) -> tensor<1x16x128xbf16>',
    shape="Elementwise", grouping="row_local", cost="vector", real_rows="local", vector_ops=1, spec=spec,
)

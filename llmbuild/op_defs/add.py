"""Add: elementwise sum with broadcasting."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef


def spec(attrs: dict[str, Any], *xs: np.ndarray) -> np.ndarray:
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out


ADD = OpDef(
    "Add", 9, "Elementwise sum with broadcasting: residuals, the attention mask.",
    '%s = "tpu.Add"(%a, %b) : (tensor<1x16x64xbf16>, tensor<1x16x64xbf16>) -> tensor<1x16x64xbf16>',
    shape="Elementwise", grouping="row_local", cost="vector", real_rows="local", vector_ops=1, spec=spec,
)

"""Cast: element type conversion, which the lowering inserts."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef


def spec(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return x  # the conversion is the rounding to the result type, done by the caller


CAST = OpDef(
    "Cast", 13, "Element type conversion, round to nearest even; inserted by the lowering.",
    '%c = "tpu.Cast"(%x) : (tensor<1x16x64xbf16>) -> tensor<1x16x64xf32>',
    shape="Cast", grouping="row_local", cost="vector", real_rows="local", vector_ops=1, spec=spec, tops=(),
)

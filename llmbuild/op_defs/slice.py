"""Slice: rows start:end of one axis."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef


def spec(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    index = [slice(None)] * x.ndim
    index[attrs["axis"]] = slice(attrs["start"], attrs["end"])
    return np.ascontiguousarray(x[tuple(index)])


SLICE = OpDef(
    "Slice", 19, "Rows start:end of one axis: a vision tower's output without its class token.",
    '%s = "tpu.Slice"(%x) {axis = 1 : i64, start = 1 : i64, end = 1025 : i64} : (tensor<1x1025x1024xbf16>) '
    "-> tensor<1x1024x1024xbf16>",
    shape="Slice", grouping="whole", cost="vector", vector_ops=1, spec=spec, moves_data=True,
)

"""A16Gather: rows of a quantized table by index, dequantized."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.a16_matmul import dequantize
from llmbuild.op_defs.op_definition import OpDef


def spec(attrs: dict[str, Any], weight: np.ndarray, scale: np.ndarray, zp: np.ndarray,
         indices: np.ndarray) -> np.ndarray:
    idx = np.asarray(indices).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= weight.shape[0]):
        raise IndexError(f"A16Gather index out of range [0, {weight.shape[0]}): {idx.min()}..{idx.max()}")
    return np.take(dequantize(attrs, weight, scale, zp), idx, axis=0)


A16_GATHER = OpDef(
    "A16Gather", 17, "Rows of a quantized table by index (a w4/w8 embedding), dequantized.",
    '%e = "tpu.A16Gather"(%q, %s, %z, %ids) {bits = 8 : i64, group_size = 64 : i64} : (...) -> '
    "tensor<1x16x64xbf16>",
    shape="A16Gather", grouping="row_local", cost="vector", vector_ops=1, spec=spec,
)

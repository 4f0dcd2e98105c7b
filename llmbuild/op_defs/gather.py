"""Gather: rows of a table by index."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef


def spec(attrs: dict[str, Any], table: np.ndarray, indices: np.ndarray) -> np.ndarray:
    idx = np.asarray(indices).astype(np.int64)
    n = table.shape[attrs["axis"]]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"Gather index out of range [0, {n}): {idx.min()}..{idx.max()}")
    return np.take(table, idx, axis=attrs["axis"])


GATHER = OpDef(
    "Gather", 1, "Rows of a table by index: the embedding lookup, the RoPE tables, act order's permutation.",
    '%e = "tpu.Gather"(%table, %ids) {axis = 0 : i64} : (tensor<512x64xf32>, tensor<1x16xi32>) -> '
    "tensor<1x16x64xf32>",
    shape="Gather", grouping="row_local", cost="vector", real_rows="local", vector_ops=1, spec=spec, moves_data=True,
)

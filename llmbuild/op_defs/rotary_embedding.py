"""Rope: rotary position embedding, rotate-half form."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef


def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def spec(attrs: dict[str, Any], x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    return x * cos + rotate_half(x) * sin


ROPE = OpDef(
    "Rope", 6, "Rotary position embedding, rotate-half form: x * cos + rotate_half(x) * sin.",
    '%q = "tpu.Rope"(%x, %cos, %sin) : (tensor<1x16x4x16xbf16>, ...) -> tensor<1x16x4x16xbf16>',
    shape="Rope", grouping="row_local", cost="vector", real_rows="local", vector_ops=3,  # x * cos, rotate(x) * sin, add
    spec=spec,
)

"""A16MatMul: a product with a weight quantized to 4 or 8 bits in groups, and its dequantizer."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef


def unpack(packed: np.ndarray) -> np.ndarray:
    """[N, K/2] bytes -> [N, K] 4-bit levels, even k from the low nibble."""
    b = np.asarray(packed).astype(np.uint8)
    return np.stack([b & 0xF, b >> 4], axis=-1).reshape(b.shape[0], -1)


def round_float32(x: np.ndarray, dtype: str) -> np.ndarray:
    """x rounded to nearest even in `dtype` (f32, bf16, f16), returned as float32 (finite x)."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "bf16":
        bits = x.view(np.uint32)
        return ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) & np.uint32(0xFFFF0000)).view(np.float32)
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    return x


def dequantize(attrs: dict[str, Any], weight: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    """(levels - zero) * scale per group of `q_group_size` along K, in the scale's type; with
    `dequant_dtype`, rounded to it as the device's dequantizer does."""
    levels = unpack(weight) if attrs.get("packed") else np.asarray(weight)
    scale = np.asarray(scale)
    n, k = levels.shape
    g = attrs["q_group_size"]
    groups = levels.reshape(n, k // g, g).astype(scale.dtype) - np.asarray(zp).astype(scale.dtype)[:, :, None]
    w = (groups * scale[:, :, None]).reshape(n, k)
    return round_float32(w, attrs["dequant_dtype"]) if attrs.get("dequant_dtype") else w


def spec(attrs: dict[str, Any], x: np.ndarray, weight: np.ndarray, scale: np.ndarray, zp: np.ndarray,
         bias: np.ndarray | None = None) -> np.ndarray:
    y = x @ dequantize(attrs, weight, scale, zp).astype(x.dtype).T
    return y if bias is None else y + bias


A16_MATMUL = OpDef(
    "A16MatMul", 14, "x @ dequant(W)^T (+ bias): 4- or 8-bit weights in groups, 16-bit activations.",
    '%y = "tpu.A16MatMul"(%x, %q, %s, %z) {bits = 4 : i64, group_size = 64 : i64} : (...) -> '
    "tensor<1x16x128xbf16>",
    shape="A16MatMul", grouping="row_local", cost="mac", real_rows="skipping", spec=spec,
)

"""Plain-Python views of ops: attributes as ints/floats/lists, tensor types as (dtype, shape, address)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    BFloat16Type,
    DenseArrayBase,
    Float16Type,
    Float32Type,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    ModuleOp,
    NoneAttr,
    Signedness,
    StringAttr,
    TensorType,
)
from xdsl.ir import Attribute, Operation


def element_name(t: Attribute) -> str:
    """The short element type name used across llmbuild: f32, bf16, f16, i32."""
    if isinstance(t, TensorType):
        t = t.element_type
    if isinstance(t, Float32Type):
        return "f32"
    if isinstance(t, BFloat16Type):
        return "bf16"
    if isinstance(t, Float16Type):
        return "f16"
    if isinstance(t, IntegerType) and t.width.data == 32:
        return "i32"
    if isinstance(t, IntegerType) and t.width.data == 8 and t.signedness.data == Signedness.UNSIGNED:
        return "u8"
    raise ValueError(f"unsupported element type {t}")


SKIPPED_ATTRS = ("loc",)


def plain(attr: Attribute) -> Any:
    if isinstance(attr, IntegerAttr):
        # BoolAttr is IntegerAttr over i1 (a generic alias, not a class isinstance accepts)
        if isinstance(attr.type, IntegerType) and attr.type.width.data == 1:
            return bool(attr.value.data)
        return int(attr.value.data)
    if isinstance(attr, FloatAttr):
        return float(attr.value.data)
    if isinstance(attr, StringAttr):
        return attr.data
    if isinstance(attr, DenseArrayBase):
        return [int(v) for v in attr.get_values()]
    if isinstance(attr, ArrayAttr):
        return [plain(a) for a in attr.data]
    raise TypeError(f"no plain form for attribute {attr}")


def op_attrs(op: Operation) -> dict[str, Any]:
    """The op's semantic attributes (and the result shape, which Reshape needs)."""
    out = {k: plain(v) for k, v in op.attributes.items() if k not in SKIPPED_ATTRS}
    if op.results and isinstance(op.results[0].type, TensorType):
        out["shape"] = list(op.results[0].type.get_shape())
    return out


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    address: int | None  # global-memory address from the type encoding, once assigned


def tensor_info(t: Attribute) -> TensorInfo:
    assert isinstance(t, TensorType)
    enc = t.encoding
    addr = None if isinstance(enc, NoneAttr) else int(enc.value.data)  # type: ignore[union-attr]
    return TensorInfo(element_name(t), tuple(t.get_shape()), addr)


def main_func(module: ModuleOp) -> func.FuncOp:
    for op in module.body.block.ops:
        if isinstance(op, func.FuncOp):
            return op
    raise ValueError("module has no function")


def string_list(attr: Attribute) -> list[str]:
    assert isinstance(attr, ArrayAttr)
    return [a.data for a in attr.data]  # type: ignore[union-attr]

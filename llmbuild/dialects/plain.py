"""Plain-Python views of ops: attributes as ints/floats/lists, tensor types as (dtype, shape, address)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    ModuleOp,
    NoneAttr,
    StringAttr,
    TensorType,
)
from xdsl.ir import Attribute, Operation

from llmbuild.importer.graph import element_name

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

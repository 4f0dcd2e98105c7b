"""The `top` and `tpu` op classes of the compute ops, made from their definitions (`llmbuild/op_defs/`).

Each class is the irdl base the definition names (`dialects/common.<shape>Base`: operands, attributes,
verifier) under the dialect's op name, with the definition's summary and example as its docstring; the
dialects register them beside their structural ops (Input, Weight; Group, Load, Store, Yield).
"""

from __future__ import annotations

from collections.abc import Iterable

from xdsl.irdl import IRDLOperation, irdl_op_definition

from llmbuild.dialects import common
from llmbuild.op_defs import OpDef
from llmbuild.op_defs.op_definition import docstring


def _op_class(dialect: str, name: str, shape: str, doc: str, module: str) -> type[IRDLOperation]:
    base = getattr(common, f"{shape}Base")
    namespace = {"name": f"{dialect}.{name}", "__doc__": doc, "__module__": module, "__qualname__": f"{name}Op"}
    return irdl_op_definition(type(f"{name}Op", (base,), namespace))


def top_classes(defs: Iterable[OpDef], module: str = __name__) -> dict[str, type[IRDLOperation]]:
    """"top.X" -> the class of top.X, for every top form of `defs`."""
    return {f"top.{form.name}": _op_class("top", form.name, form.shape, docstring(form.summary, form.example), module)
            for op in defs for form in op.top_forms()}


def tpu_classes(defs: Iterable[OpDef], module: str = __name__) -> dict[str, type[IRDLOperation]]:
    """"tpu.X" -> the class of tpu.X, for every op of `defs`."""
    return {f"tpu.{op.name}": _op_class("tpu", op.name, op.shape, op.doc(), module) for op in defs}

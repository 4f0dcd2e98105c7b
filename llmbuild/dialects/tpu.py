"""The `tpu` dialect: the chip-level form of a net (TPU-MLIR's Tpu dialect).

After `lower-top-to-tpu` every tensor has the element type the device computes in (f32, bf16, f16);
`top.Input` and `top.Weight` stay as they are, as in TPU-MLIR. After `assign-address` every tensor type
carries its global-memory address as the tensor encoding, TPU-MLIR's convention:

    %3 = "tpu.MatMul"(%1, %2) {...} : (...) -> tensor<1x16x64xbf16, 1052672 : i64>

SiLU becomes `tpu.Active {mode = "SILU"}`; `tpu.Cast` converts element types where the device does.

After `layer-group` the compute ops sit inside `tpu.Group` ops (TPU-MLIR's `tpu.Group`): each group's
region loads what it reads from global memory into local memory (`tpu.Load`), computes there, stores what
later groups or the net's outputs need (`tpu.Store`) and yields the stored values (`tpu.Yield`). Types keep
their global shapes and addresses (the value's home in global memory); where each value lives in local
memory and how it is sliced is the `ginfo` attribute of each op (docs/design.md, "Layer groups").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from xdsl.dialects.builtin import DenseArrayBase, DictionaryAttr, IntegerAttr, StringAttr, TensorType
from xdsl.ir import Attribute, Dialect
from xdsl.irdl import (
    AttrConstraint,
    IRDLOperation,
    attr_def,
    irdl_op_definition,
    operand_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.irdl.constraints import VerificationContext
from xdsl.traits import IsTerminator
from xdsl.utils.exceptions import VerifyException

from llmbuild.dialects import from_definitions
from llmbuild.op_defs import OPS

# ginfo modes. A Load brings a value into local memory held whole, per row tile, per key block (flash
# attention), as streamed weight slices or per block of heads (a gated delta rule's); a Store writes it
# back whole, per row tile or per block of heads; a compute op's result is per key block when it is fused
# into the attention that reads it.
LOAD_MODES = ("held", "tile", "block", "stream", "head")
STORE_MODES = ("whole", "tile", "head")
COMPUTE_MODES = ("block",)
_SLICED_LOADS = ("tile", "block", "stream", "head")  # loads that slice along an axis


@dataclass(frozen=True)
class GroupInfo:
    """The `ginfo` attribute of an op inside a `tpu.Group`, typed: where the value lives in local memory
    and how it is sliced. In the IR it is a builtin dictionary (so upstream `mlir-opt` parses the files),
    whose keys and value types `GroupInfoConstraint` checks on every op that carries one.

        {mode = "tile", axis = 1, lmem = array<i64: 0, 4096>}           a Load of row tiles, two buffers
        {lmem = array<i64: 139264>, scratch = array<i64: 8192, 512>}   an attention's result and scratch
    """

    mode: str | None = None
    axis: int | None = None
    row_axis: int | None = None  # a mask's rows, when the key blocks run along its columns
    lmem: tuple[int, ...] = ()  # local address of the value, or of each of its alternating buffers
    scratch: tuple[int, int] | None = None  # (local address, bytes) of an attention's scores
    state: tuple[int, int] | None = None  # (local address, bytes) of flash attention's running state

    @staticmethod
    def of(attr: Attribute) -> GroupInfo:
        if not isinstance(attr, DictionaryAttr):
            raise VerifyException(f"ginfo: expected a dictionary, got {attr}")
        fields: dict[str, object] = {}
        for key, value in attr.data.items():
            if key == "mode":
                if not isinstance(value, StringAttr):
                    raise VerifyException(f"ginfo.mode: expected a string, got {value}")
                fields[key] = value.data
            elif key in ("axis", "row_axis"):
                if not isinstance(value, IntegerAttr) or int(value.value.data) < 0:
                    raise VerifyException(f"ginfo.{key}: expected an integer >= 0, got {value}")
                fields[key] = int(value.value.data)
            elif key in ("lmem", "scratch", "state"):
                if not isinstance(value, DenseArrayBase):
                    raise VerifyException(f"ginfo.{key}: expected array<i64: ...>, got {value}")
                numbers = tuple(int(v) for v in value.get_values())
                if any(v < 0 for v in numbers) or (key == "lmem" and not 1 <= len(numbers) <= 2) or (
                        key != "lmem" and len(numbers) != 2):
                    want = "one or two addresses" if key == "lmem" else "an address and a size"
                    raise VerifyException(f"ginfo.{key}: expected {want} >= 0, got {list(numbers)}")
                fields[key] = numbers
            else:
                raise VerifyException(f"ginfo: unknown key {key!r} (expected mode, axis, row_axis, lmem, scratch, "
                                      "state)")
        return GroupInfo(**fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class GroupInfoConstraint(AttrConstraint):
    """IRDL constraint: the attribute is a `GroupInfo` dictionary whose mode is one of `modes`."""

    modes: tuple[str | None, ...]
    in_local_memory: bool = True  # the value has a local address (Loads, compute ops; not Stores)
    sliced: tuple[str, ...] = ()  # the modes that slice along an axis, which ginfo must then name

    def verify(self, attr: Attribute, constraint_context: VerificationContext) -> None:
        info = GroupInfo.of(attr)
        if info.mode not in self.modes:
            shown = ", ".join(str(m) for m in self.modes)
            raise VerifyException(f"ginfo.mode: expected one of {shown}, got {info.mode!r}")
        if self.in_local_memory and not info.lmem:
            raise VerifyException("ginfo.lmem: expected the local address of the value")
        if info.mode in self.sliced and info.axis is None:
            raise VerifyException(f"ginfo: a {info.mode} load needs an axis")

    def get_bases(self) -> set[type[Attribute]] | None:
        return {DictionaryAttr}

    def mapping_type_vars(self, type_var_mapping: Mapping[TypeVar, Any]) -> GroupInfoConstraint:
        return self  # no type variables inside


COMPUTE = from_definitions.tpu_classes(OPS, __name__)
globals().update({cls.__name__: cls for cls in COMPUTE.values()})  # tpu.MatMulOp, tpu.ActiveOp, ...


_GROUP_COUNTS = ("group", "rows", "tile_rows", "lmem_peak_bytes", "stream_slot_bytes")


@irdl_op_definition
class GroupOp(IRDLOperation):
    """A layer group: consecutive ops computed in local memory; results are the values it stores.

    Its body holds `tpu.Load`s, compute ops (each with a `ginfo`), `tpu.Store`s and a final `tpu.Yield`
    of exactly the stored values, in the order and with the types of the group's results.

    Example:

        %s = "tpu.Group"() ({ %x = "tpu.Load"(%in) {ginfo = {mode = "tile", axis = 1, lmem = ...}} ...
                             "tpu.Yield"(%stored) }) {group = 0, rows = 16, tile_rows = 8, ...} : () -> ...
    """

    name = "tpu.Group"
    outputs = var_result_def(TensorType)
    body = region_def("single_block")

    def verify_(self) -> None:
        for key in _GROUP_COUNTS:
            value = self.attributes.get(key)
            if not isinstance(value, IntegerAttr) or int(value.value.data) < 0:
                raise VerifyException(f"tpu.Group: {key}: expected an integer >= 0, got {value}")
        rows, tile_rows = (int(self.attributes[k].value.data) for k in ("rows", "tile_rows"))  # type: ignore
        if tile_rows > rows:
            raise VerifyException(f"tpu.Group: tile_rows {tile_rows} exceeds rows {rows}")
        ops = list(self.body.block.ops)
        if not ops or not isinstance(ops[-1], YieldOp):
            raise VerifyException("tpu.Group: expected its body to end with tpu.Yield")
        yielded = list(ops[-1].operands)
        if [v.type for v in yielded] != [r.type for r in self.results]:
            raise VerifyException("tpu.Group: the yielded values' types differ from the group's results")
        if any(not isinstance(v.owner, StoreOp) for v in yielded):
            raise VerifyException("tpu.Group: expected to yield only values it stores (tpu.Store results)")
        for op in ops[:-1]:
            if isinstance(op, (LoadOp, StoreOp)):
                continue
            if not op.name.startswith("tpu.") or isinstance(op, (GroupOp, YieldOp)):
                raise VerifyException(f"tpu.Group: {op.name} cannot be inside a group")
            if "ginfo" not in op.attributes:
                raise VerifyException(f"tpu.Group: {op.name} has no ginfo (where its result lives)")
            GroupInfoConstraint(COMPUTE_MODES + (None,)).verify(op.attributes["ginfo"], VerificationContext())


@irdl_op_definition
class LoadOp(IRDLOperation):
    """Global -> local memory: the whole tensor, its row tiles, its key blocks, or streamed slices of
    weight rows, as `ginfo` (a `GroupInfo`) says.

    Example:

        %x = "tpu.Load"(%in) {ginfo = {mode = "tile", axis = 1 : i64, lmem = array<i64: 0, 4096>}}
             : (tensor<1x16x64xbf16, 1052672 : i64>) -> tensor<1x16x64xbf16, 1052672 : i64>
    """

    name = "tpu.Load"
    input = operand_def(TensorType)
    output = result_def(TensorType)
    ginfo = attr_def(GroupInfoConstraint(LOAD_MODES, sliced=_SLICED_LOADS))

    def verify_(self) -> None:
        if self.input.type != self.output.type:
            raise VerifyException("tpu.Load: expected the result to keep the loaded value's type")


@irdl_op_definition
class StoreOp(IRDLOperation):
    """Local -> global memory, at the address in the result type, whole or per row tile (`ginfo`).

    Example:

        %s = "tpu.Store"(%y) {ginfo = {mode = "whole"}} : (tensor<1x16x64xbf16, ...>) -> tensor<...>
    """

    name = "tpu.Store"
    input = operand_def(TensorType)
    output = result_def(TensorType)
    ginfo = attr_def(GroupInfoConstraint(STORE_MODES, in_local_memory=False))

    def verify_(self) -> None:
        if self.input.type.get_shape() != self.output.type.get_shape() or \
                self.input.type.element_type != self.output.type.element_type:
            raise VerifyException("tpu.Store: expected the stored value's shape and element type")


@irdl_op_definition
class YieldOp(IRDLOperation):
    """The end of a `tpu.Group`'s body: the values it stores, which become the group's results."""

    name = "tpu.Yield"
    values = var_operand_def(TensorType)
    traits = traits_def(IsTerminator())


Tpu = Dialect("tpu", [*COMPUTE.values(), GroupOp, LoadOp, StoreOp, YieldOp], [])

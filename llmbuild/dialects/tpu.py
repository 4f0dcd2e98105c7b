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

from xdsl.dialects.builtin import DictionaryAttr, TensorType
from xdsl.ir import Dialect
from xdsl.irdl import (
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
from xdsl.traits import IsTerminator

from llmbuild.dialects import common


@irdl_op_definition
class GatherOp(common.GatherBase):
    name = "tpu.Gather"


@irdl_op_definition
class RMSNormOp(common.RMSNormBase):
    name = "tpu.RMSNorm"


@irdl_op_definition
class MatMulOp(common.MatMulBase):
    name = "tpu.MatMul"


@irdl_op_definition
class A16MatMulOp(common.A16MatMulBase):
    name = "tpu.A16MatMul"


@irdl_op_definition
class A16GatherOp(common.A16GatherBase):
    name = "tpu.A16Gather"


@irdl_op_definition
class ReshapeOp(common.ReshapeBase):
    name = "tpu.Reshape"


@irdl_op_definition
class PermuteOp(common.PermuteBase):
    name = "tpu.Permute"


@irdl_op_definition
class RopeOp(common.RopeBase):
    name = "tpu.Rope"


@irdl_op_definition
class FAttentionOp(common.FAttentionBase):
    name = "tpu.FAttention"


@irdl_op_definition
class ConcatOp(common.ConcatBase):
    name = "tpu.Concat"


@irdl_op_definition
class AddOp(common.ElementwiseBase):
    name = "tpu.Add"


@irdl_op_definition
class MulOp(common.ElementwiseBase):
    name = "tpu.Mul"


@irdl_op_definition
class ActiveOp(common.ActiveBase):
    name = "tpu.Active"


@irdl_op_definition
class SoftmaxOp(common.SoftmaxBase):
    name = "tpu.Softmax"


@irdl_op_definition
class CastOp(common.CastBase):
    name = "tpu.Cast"


@irdl_op_definition
class GroupOp(IRDLOperation):
    """A layer group: consecutive ops computed in local memory; results are the values it stores."""

    name = "tpu.Group"
    outputs = var_result_def(TensorType)
    body = region_def("single_block")


@irdl_op_definition
class LoadOp(IRDLOperation):
    """Global -> local memory (the whole tensor, a row tile, or a slice of weight rows: `ginfo`)."""

    name = "tpu.Load"
    input = operand_def(TensorType)
    output = result_def(TensorType)
    ginfo = attr_def(DictionaryAttr)


@irdl_op_definition
class StoreOp(IRDLOperation):
    """Local -> global memory, at the address in the result type."""

    name = "tpu.Store"
    input = operand_def(TensorType)
    output = result_def(TensorType)
    ginfo = attr_def(DictionaryAttr)


@irdl_op_definition
class YieldOp(IRDLOperation):
    name = "tpu.Yield"
    values = var_operand_def(TensorType)
    traits = traits_def(IsTerminator())


Tpu = Dialect(
    "tpu",
    [
        GatherOp,
        RMSNormOp,
        MatMulOp,
        A16MatMulOp,
        A16GatherOp,
        ReshapeOp,
        PermuteOp,
        RopeOp,
        FAttentionOp,
        ConcatOp,
        AddOp,
        MulOp,
        ActiveOp,
        SoftmaxOp,
        CastOp,
        GroupOp,
        LoadOp,
        StoreOp,
        YieldOp,
    ],
    [],
)

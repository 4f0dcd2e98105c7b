"""The `top` dialect: framework- and chip-independent model semantics (TPU-MLIR's Top dialect).

Tensors are f32 (integer ids and positions are si32/i32). Weights are `top.Weight` ops naming a tensor
in the module's weight file. Each op's numpy semantics live in `llmbuild.dialects.kernels`.

Example (one RMSNorm):

    %1 = "top.Weight"() {name = "layers.0.input_layernorm.weight"} : () -> tensor<64xf32>
    %2 = "top.RMSNorm"(%0, %1) {eps = 1.0e-06 : f64} : (tensor<1x16x64xf32>, tensor<64xf32>) -> ...
"""

from __future__ import annotations

from xdsl.ir import Dialect
from xdsl.irdl import irdl_op_definition

from llmbuild.dialects import common


@irdl_op_definition
class InputOp(common.InputBase):
    name = "top.Input"


@irdl_op_definition
class WeightOp(common.WeightBase):
    name = "top.Weight"


@irdl_op_definition
class GatherOp(common.GatherBase):
    name = "top.Gather"


@irdl_op_definition
class RMSNormOp(common.RMSNormBase):
    name = "top.RMSNorm"


@irdl_op_definition
class MatMulOp(common.MatMulBase):
    name = "top.MatMul"


@irdl_op_definition
class A16MatMulOp(common.A16MatMulBase):
    name = "top.A16MatMul"


@irdl_op_definition
class A16GatherOp(common.A16GatherBase):
    name = "top.A16Gather"


@irdl_op_definition
class ReshapeOp(common.ReshapeBase):
    name = "top.Reshape"


@irdl_op_definition
class PermuteOp(common.PermuteBase):
    name = "top.Permute"


@irdl_op_definition
class RopeOp(common.RopeBase):
    name = "top.Rope"


@irdl_op_definition
class FAttentionOp(common.FAttentionBase):
    name = "top.FAttention"


@irdl_op_definition
class ConcatOp(common.ConcatBase):
    name = "top.Concat"


@irdl_op_definition
class AddOp(common.ElementwiseBase):
    name = "top.Add"


@irdl_op_definition
class MulOp(common.ElementwiseBase):
    name = "top.Mul"


@irdl_op_definition
class SiLUOp(common.UnaryBase):
    name = "top.SiLU"


@irdl_op_definition
class SoftmaxOp(common.SoftmaxBase):
    name = "top.Softmax"


Top = Dialect(
    "top",
    [
        InputOp,
        WeightOp,
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
        SiLUOp,
        SoftmaxOp,
    ],
    [],
)

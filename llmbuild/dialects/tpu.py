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
    """Rows of a table by index: the embedding lookup, the RoPE tables, act order's permutation.

    Example:

        %e = "tpu.Gather"(%table, %ids) {axis = 0 : i64} : (tensor<512x64xf32>, tensor<1x16xi32>) ->
        tensor<1x16x64xf32>
    """

    name = "tpu.Gather"


@irdl_op_definition
class RMSNormOp(common.RMSNormBase):
    """x / sqrt(mean(x^2) + eps) * gamma over the last axis.

    Example:

        %y = "tpu.RMSNorm"(%x, %g) {eps = 1.0e-06 : f64} : (tensor<1x16x64xbf16>, tensor<64xbf16>) ->
        tensor<1x16x64xbf16>
    """

    name = "tpu.RMSNorm"


@irdl_op_definition
class MatMulOp(common.MatMulBase):
    """x @ W (+ bias) over the last axis; W is [K, N], or [N, K] transposed.

    Example:

        %y = "tpu.MatMul"(%x, %w) {right_transpose = true} : (tensor<1x16x64xbf16>, tensor<128x64xbf16>) ->
        tensor<1x16x128xbf16>
    """

    name = "tpu.MatMul"


@irdl_op_definition
class A16MatMulOp(common.A16MatMulBase):
    """x @ dequant(W)^T (+ bias): 4- or 8-bit weights in groups, 16-bit activations.

    Example:

        %y = "tpu.A16MatMul"(%x, %q, %s, %z) {bits = 4 : i64, group_size = 64 : i64} : (...) ->
        tensor<1x16x128xbf16>
    """

    name = "tpu.A16MatMul"


@irdl_op_definition
class A16GatherOp(common.A16GatherBase):
    """Rows of a quantized table by index (a w4/w8 embedding), dequantized.

    Example:

        %e = "tpu.A16Gather"(%q, %s, %z, %ids) {bits = 8 : i64, group_size = 64 : i64} : (...) ->
        tensor<1x16x64xbf16>
    """

    name = "tpu.A16Gather"


@irdl_op_definition
class ReshapeOp(common.ReshapeBase):
    """The same elements in another shape (a view when assign-address aliases it).

    Example:

        %r = "tpu.Reshape"(%x) {shape = array<i64: 1, 16, 4, 16>} : (tensor<1x16x64xbf16>) ->
        tensor<1x16x4x16xbf16>
    """

    name = "tpu.Reshape"


@irdl_op_definition
class PermuteOp(common.PermuteBase):
    """Axes in another order.

    Example:

        %p = "tpu.Permute"(%x) {order = array<i64: 0, 2, 1, 3>} : (tensor<1x16x4x16xbf16>) ->
        tensor<1x4x16x16xbf16>
    """

    name = "tpu.Permute"


@irdl_op_definition
class RopeOp(common.RopeBase):
    """Rotary position embedding, rotate-half form: x * cos + rotate_half(x) * sin.

    Example:

        %q = "tpu.Rope"(%x, %cos, %sin) : (tensor<1x16x4x16xbf16>, ...) -> tensor<1x16x4x16xbf16>
    """

    name = "tpu.Rope"


@irdl_op_definition
class FAttentionOp(common.FAttentionBase):
    """Grouped-query attention softmax(q k^T * scale + mask) v, in key blocks when long.

    Example:

        %a = "tpu.FAttention"(%q, %k, %v, %mask) {scale = 0.25 : f64, q_head = 4 : i64, kv_head = 2 : i64} :
        (...) -> tensor<1x16x64xbf16>
    """

    name = "tpu.FAttention"


@irdl_op_definition
class ConcatOp(common.ConcatBase):
    """Tensors joined along an axis: the KV history and the new rows.

    Example:

        %k = "tpu.Concat"(%hk, %kn) {axis = 1 : i64} : (tensor<1x48x2x16xbf16>, tensor<1x16x2x16xbf16>) ->
        tensor<1x64x2x16xbf16>
    """

    name = "tpu.Concat"


@irdl_op_definition
class AddOp(common.ElementwiseBase):
    """Elementwise sum with broadcasting: residuals, the attention mask.

    Example:

        %s = "tpu.Add"(%a, %b) : (tensor<1x16x64xbf16>, tensor<1x16x64xbf16>) -> tensor<1x16x64xbf16>
    """

    name = "tpu.Add"


@irdl_op_definition
class MulOp(common.ElementwiseBase):
    """Elementwise product with broadcasting: the gated MLP.

    Example:

        %m = "tpu.Mul"(%a, %b) : (tensor<1x16x128xbf16>, tensor<1x16x128xbf16>) -> tensor<1x16x128xbf16>
    """

    name = "tpu.Mul"


@irdl_op_definition
class ActiveOp(common.ActiveBase):
    """An activation chosen by mode (TPU-MLIR's Active); SILU here, from top.SiLU.

    Example:

        %g = "tpu.Active"(%x) {mode = "SILU"} : (tensor<1x16x128xbf16>) -> tensor<1x16x128xbf16>
    """

    name = "tpu.Active"


@irdl_op_definition
class SoftmaxOp(common.SoftmaxBase):
    """softmax over an axis.

    Example:

        %p = "tpu.Softmax"(%x) {axis = -1 : i64} : (tensor<1x4x16x64xf32>) -> tensor<1x4x16x64xf32>
    """

    name = "tpu.Softmax"


@irdl_op_definition
class CastOp(common.CastBase):
    """Element type conversion, round to nearest even; inserted by the lowering.

    Example:

        %c = "tpu.Cast"(%x) : (tensor<1x16x64xbf16>) -> tensor<1x16x64xf32>
    """

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

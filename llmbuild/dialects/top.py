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
    """Rows of a table by index: the embedding lookup, the RoPE tables, act order's permutation.

    Example:

        %e = "top.Gather"(%table, %ids) {axis = 0 : i64} : (tensor<512x64xf32>, tensor<1x16xi32>) ->
        tensor<1x16x64xf32>
    """

    name = "top.Gather"


@irdl_op_definition
class RMSNormOp(common.RMSNormBase):
    """x / sqrt(mean(x^2) + eps) * gamma over the last axis.

    Example:

        %y = "top.RMSNorm"(%x, %g) {eps = 1.0e-06 : f64} : (tensor<1x16x64xf32>, tensor<64xf32>) ->
        tensor<1x16x64xf32>
    """

    name = "top.RMSNorm"


@irdl_op_definition
class MatMulOp(common.MatMulBase):
    """x @ W (+ bias) over the last axis; W is [K, N], or [N, K] transposed.

    Example:

        %y = "top.MatMul"(%x, %w) {right_transpose = true} : (tensor<1x16x64xf32>, tensor<128x64xf32>) ->
        tensor<1x16x128xf32>
    """

    name = "top.MatMul"


@irdl_op_definition
class A16MatMulOp(common.A16MatMulBase):
    """x @ dequant(W)^T (+ bias): 4- or 8-bit weights in groups, 16-bit activations.

    Example:

        %y = "top.A16MatMul"(%x, %q, %s, %z) {bits = 4 : i64, group_size = 64 : i64} : (...) ->
        tensor<1x16x128xf32>
    """

    name = "top.A16MatMul"


@irdl_op_definition
class A16GatherOp(common.A16GatherBase):
    """Rows of a quantized table by index (a w4/w8 embedding), dequantized.

    Example:

        %e = "top.A16Gather"(%q, %s, %z, %ids) {bits = 8 : i64, group_size = 64 : i64} : (...) ->
        tensor<1x16x64xf32>
    """

    name = "top.A16Gather"


@irdl_op_definition
class ReshapeOp(common.ReshapeBase):
    """The same elements in another shape (a view when assign-address aliases it).

    Example:

        %r = "top.Reshape"(%x) {shape = array<i64: 1, 16, 4, 16>} : (tensor<1x16x64xf32>) ->
        tensor<1x16x4x16xf32>
    """

    name = "top.Reshape"


@irdl_op_definition
class PermuteOp(common.PermuteBase):
    """Axes in another order.

    Example:

        %p = "top.Permute"(%x) {order = array<i64: 0, 2, 1, 3>} : (tensor<1x16x4x16xf32>) ->
        tensor<1x4x16x16xf32>
    """

    name = "top.Permute"


@irdl_op_definition
class RopeOp(common.RopeBase):
    """Rotary position embedding, rotate-half form: x * cos + rotate_half(x) * sin.

    Example:

        %q = "top.Rope"(%x, %cos, %sin) : (tensor<1x16x4x16xf32>, ...) -> tensor<1x16x4x16xf32>
    """

    name = "top.Rope"


@irdl_op_definition
class FAttentionOp(common.FAttentionBase):
    """Grouped-query attention softmax(q k^T * scale + mask) v, in key blocks when long.

    Example:

        %a = "top.FAttention"(%q, %k, %v, %mask) {scale = 0.25 : f64, q_head = 4 : i64, kv_head = 2 : i64} :
        (...) -> tensor<1x16x64xf32>
    """

    name = "top.FAttention"


@irdl_op_definition
class ConcatOp(common.ConcatBase):
    """Tensors joined along an axis: the KV history and the new rows.

    Example:

        %k = "top.Concat"(%hk, %kn) {axis = 1 : i64} : (tensor<1x48x2x16xf32>, tensor<1x16x2x16xf32>) ->
        tensor<1x64x2x16xf32>
    """

    name = "top.Concat"


@irdl_op_definition
class AddOp(common.ElementwiseBase):
    """Elementwise sum with broadcasting: residuals, the attention mask.

    Example:

        %s = "top.Add"(%a, %b) : (tensor<1x16x64xf32>, tensor<1x16x64xf32>) -> tensor<1x16x64xf32>
    """

    name = "top.Add"


@irdl_op_definition
class MulOp(common.ElementwiseBase):
    """Elementwise product with broadcasting: the gated MLP.

    Example:

        %m = "top.Mul"(%a, %b) : (tensor<1x16x128xf32>, tensor<1x16x128xf32>) -> tensor<1x16x128xf32>
    """

    name = "top.Mul"


@irdl_op_definition
class SiLUOp(common.UnaryBase):
    """An activation chosen by mode (TPU-MLIR's Active); SILU here, from top.SiLU. Lowered to tpu.Active.

    Example:

        %g = "top.SiLU"(%x) : (tensor<1x16x128xf32>) -> tensor<1x16x128xf32>
    """

    name = "top.SiLU"


@irdl_op_definition
class GELUOp(common.UnaryBase):
    """GELU, the exact (erf) form: x / 2 * (1 + erf(x / sqrt(2))). Lowered to tpu.Active {mode = "GELU"}.

    Example:

        %g = "top.GELU"(%x) : (tensor<1x1025x4096xf32>) -> tensor<1x1025x4096xf32>
    """

    name = "top.GELU"


@irdl_op_definition
class GELUTanhOp(common.UnaryBase):
    """GELU, the tanh form: x / 2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) (SigLIP's
    gelu_pytorch_tanh). Lowered to tpu.Active {mode = "GELU_TANH"}.

    Example:

        %g = "top.GELUTanh"(%x) : (tensor<1x1024x4304xf32>) -> tensor<1x1024x4304xf32>
    """

    name = "top.GELUTanh"


@irdl_op_definition
class LayerNormOp(common.LayerNormBase):
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis.

    Example:

        %y = "top.LayerNorm"(%x, %g, %b) {eps = 1.0e-06 : f64} : (tensor<1x1025x1024xf32>, tensor<1024xf32>,
        tensor<1024xf32>) -> tensor<1x1025x1024xf32>
    """

    name = "top.LayerNorm"


@irdl_op_definition
class SliceOp(common.SliceBase):
    """Rows start:end of one axis.

    Example:

        %s = "top.Slice"(%x) {axis = 1 : i64, start = 1 : i64, end = 1025 : i64} : (tensor<1x1025x1024xf32>) ->
        tensor<1x1024x1024xf32>
    """

    name = "top.Slice"


@irdl_op_definition
class SoftmaxOp(common.SoftmaxBase):
    """softmax over an axis.

    Example:

        %p = "top.Softmax"(%x) {axis = -1 : i64} : (tensor<1x4x16x64xf32>) -> tensor<1x4x16x64xf32>
    """

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
        GELUOp,
        GELUTanhOp,
        LayerNormOp,
        SliceOp,
    ],
    [],
)

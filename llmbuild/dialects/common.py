"""Operation shapes shared by the `top` and `tpu` dialects.

TPU-MLIR defines most ops twice: once in Top (semantics) and once in Tpu (the same op after a lowering
decision). The operands, attributes and shape rules are the same in both, so each base class here
declares them once with its verifier; `top.py` and `tpu.py` give each a dialect name. Attribute
names follow TPU-MLIR (`right_transpose`, `q_head`, `kv_head`, `mq`, `mk`, `axis`, `order`, `eps`).

All attributes are MLIR builtin attributes so that every emitted file parses with upstream `mlir-opt
--allow-unregistered-dialect`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xdsl.dialects.builtin import (
    BoolAttr,
    DenseArrayBase,
    FloatAttr,
    IntegerAttr,
    StringAttr,
    TensorType,
    f64,
    i64,
)
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    attr_def,
    operand_def,
    opt_attr_def,
    opt_operand_def,
    result_def,
    var_operand_def,
)
from xdsl.utils.exceptions import VerifyException


def shape_of(value: SSAValue | Attribute) -> tuple[int, ...]:
    typ = value.type if isinstance(value, SSAValue) else value
    assert isinstance(typ, TensorType), f"expected a tensor, got {typ}"
    return tuple(typ.get_shape())


def i64_attr(v: int) -> IntegerAttr:
    return IntegerAttr(v, i64)


def f64_attr(v: float) -> FloatAttr:
    return FloatAttr(v, f64)


def bool_attr(v: bool) -> BoolAttr:
    return BoolAttr.from_bool(v)


def i64_array(values: Sequence[int]) -> DenseArrayBase:
    return DenseArrayBase.from_list(i64, list(values))


def _expect(cond: bool, op: IRDLOperation, msg: str) -> None:
    if not cond:
        raise VerifyException(f"{op.name}: {msg}")


class InputBase(IRDLOperation):
    """Marks a function argument as a net input (TPU-MLIR: `top.Input`)."""

    input = operand_def(TensorType)
    output = result_def(TensorType)

    def verify_(self) -> None:
        _expect(shape_of(self.input) == shape_of(self.output), self, "input and output shapes differ")


class WeightBase(IRDLOperation):
    """A constant tensor stored in a side file (safetensors), referenced by `name`."""

    output = result_def(TensorType)
    weight_name = attr_def(StringAttr, attr_name="name")


class GatherBase(IRDLOperation):
    """`output = take(input, indices, axis)`: embedding lookup and RoPE table lookup."""

    input = operand_def(TensorType)
    indices = operand_def(TensorType)
    output = result_def(TensorType)
    axis = attr_def(IntegerAttr)

    def verify_(self) -> None:
        axis = self.axis.value.data
        src, idx = shape_of(self.input), shape_of(self.indices)
        _expect(0 <= axis < len(src), self, f"axis {axis} out of range for input rank {len(src)}")
        want = src[:axis] + idx + src[axis + 1 :]
        _expect(shape_of(self.output) == want, self, f"output shape should be {want}")


class RMSNormBase(IRDLOperation):
    """`x / sqrt(mean(x^2, -1) + eps) * gamma` over the last axis."""

    input = operand_def(TensorType)
    gamma = operand_def(TensorType)
    output = result_def(TensorType)
    eps = attr_def(FloatAttr)

    def verify_(self) -> None:
        _expect(shape_of(self.gamma) == shape_of(self.input)[-1:], self, "gamma must match the last axis")
        _expect(shape_of(self.output) == shape_of(self.input), self, "output shape must equal input")


class LayerNormBase(IRDLOperation):
    """`(x - mean(x)) / sqrt(var(x) + eps) * gamma + beta` over the last axis (the vision towers' norm)."""

    input = operand_def(TensorType)
    gamma = operand_def(TensorType)
    beta = operand_def(TensorType)
    output = result_def(TensorType)
    eps = attr_def(FloatAttr)

    def verify_(self) -> None:
        last = shape_of(self.input)[-1:]
        _expect(shape_of(self.gamma) == last and shape_of(self.beta) == last, self,
                "gamma and beta must match the last axis")
        _expect(shape_of(self.output) == shape_of(self.input), self, "output shape must equal input")


class SliceBase(IRDLOperation):
    """`input[..., start:end, ...]` along one axis, step 1 (a vision tower drops its class token)."""

    input = operand_def(TensorType)
    output = result_def(TensorType)
    axis = attr_def(IntegerAttr)
    start = attr_def(IntegerAttr)
    end = attr_def(IntegerAttr)

    def verify_(self) -> None:
        src = shape_of(self.input)
        axis, start, end = self.axis.value.data, self.start.value.data, self.end.value.data
        _expect(0 <= axis < len(src), self, f"axis {axis} out of range for rank {len(src)}")
        _expect(0 <= start < end <= src[axis], self, f"slice {start}:{end} out of range [0, {src[axis]}]")
        want = src[:axis] + (end - start,) + src[axis + 1 :]
        _expect(shape_of(self.output) == want, self, f"output shape should be {want}")


class MatMulBase(IRDLOperation):
    """`input @ right (+ bias)` over the last axis; right is [K, N], or [N, K] with right_transpose."""

    input = operand_def(TensorType)
    right = operand_def(TensorType)
    bias = opt_operand_def(TensorType)
    output = result_def(TensorType)
    right_transpose = attr_def(BoolAttr)
    do_relu = attr_def(BoolAttr)

    def verify_(self) -> None:
        x, w = shape_of(self.input), shape_of(self.right)
        _expect(len(w) == 2 and len(x) >= 1, self, f"input {x} does not match right {w} (right must be rank 2)")
        k, n = (w[1], w[0]) if self.right_transpose.value.data else (w[0], w[1])
        _expect(x[-1] == k, self, f"input K={x[-1]} does not match right {w}")
        _expect(shape_of(self.output) == x[:-1] + (n,), self, f"output must be {x[:-1] + (n,)}")
        if self.bias is not None:
            _expect(shape_of(self.bias) == (n,), self, f"bias must be [{n}]")


class A16MatMulBase(IRDLOperation):
    """`input @ dequant(weight)^T (+ bias)`, weight-only quantization with 16-bit activations.

    dequant(w)[n, k] = (w[n, k] - zp[n, k // g]) * scale[n, k // g], g = q_group_size. In `top` the weight
    holds one level per element [N, K]; in `tpu` 4-bit levels are packed two per byte along K ([N, K/2],
    even k in the low nibble: `packed = true`) and the device rounds the dequantized weight to the
    activation type (`dequant_dtype`) before the f32-accumulated product (TPU-MLIR's A16MatMul).
    """

    input = operand_def(TensorType)
    weight = operand_def(TensorType)
    scale = operand_def(TensorType)
    zp = operand_def(TensorType)
    bias = opt_operand_def(TensorType)
    output = result_def(TensorType)
    weight_bits = attr_def(IntegerAttr)
    q_group_size = attr_def(IntegerAttr)

    def verify_(self) -> None:
        x, w, s, z = shape_of(self.input), shape_of(self.weight), shape_of(self.scale), shape_of(self.zp)
        bits, g = self.weight_bits.value.data, self.q_group_size.value.data
        _expect(bits in (4, 8), self, f"weight_bits must be 4 or 8, got {bits}")
        _expect(len(w) == 2 and len(x) >= 1, self, f"weight must be [N, K], got {w}")
        packed = "packed" in self.attributes and bool(self.attributes["packed"].value.data)  # type: ignore[attr-defined]
        k = w[1] * (2 if packed else 1)
        _expect(x[-1] == k, self, f"input K={x[-1]} does not match weight {w} (packed={packed})")
        _expect(g > 0 and k % g == 0, self, f"q_group_size {g} must divide K={k}")
        _expect(s == (w[0], k // g) and z == s, self, f"scale and zp must be [{w[0]}, {k // g}], got {s} and {z}")
        _expect(shape_of(self.output) == x[:-1] + (w[0],), self, f"output must be {x[:-1] + (w[0],)}")
        if self.bias is not None:
            _expect(shape_of(self.bias) == (w[0],), self, f"bias must be [{w[0]}]")


class A16GatherBase(IRDLOperation):
    """`output = take(dequant(weight), indices, axis=0)`: the embedding lookup of a quantized table.

    A tied embedding is stored once, quantized, for both its uses: `A16MatMul` in lm_head reads the whole
    table, this op only the rows of the tokens (dequantized as A16MatMul does: same levels, scales, zero
    points, packing and `dequant_dtype`), so quantizing lm_head does not cost a second float copy.
    """

    weight = operand_def(TensorType)
    scale = operand_def(TensorType)
    zp = operand_def(TensorType)
    indices = operand_def(TensorType)
    output = result_def(TensorType)
    weight_bits = attr_def(IntegerAttr)
    q_group_size = attr_def(IntegerAttr)

    def verify_(self) -> None:
        w, s, z, idx = (shape_of(v) for v in (self.weight, self.scale, self.zp, self.indices))
        bits, g = self.weight_bits.value.data, self.q_group_size.value.data
        _expect(bits in (4, 8), self, f"weight_bits must be 4 or 8, got {bits}")
        _expect(len(w) == 2, self, f"weight must be [V, H], got {w}")
        packed = "packed" in self.attributes and bool(self.attributes["packed"].value.data)  # type: ignore[attr-defined]
        h = w[1] * (2 if packed else 1)
        _expect(g > 0 and h % g == 0, self, f"q_group_size {g} must divide H={h}")
        _expect(s == (w[0], h // g) and z == s, self, f"scale and zp must be [{w[0]}, {h // g}], got {s} and {z}")
        _expect(shape_of(self.output) == idx + (h,), self, f"output must be {idx + (h,)}")


class ReshapeBase(IRDLOperation):
    input = operand_def(TensorType)
    output = result_def(TensorType)

    def verify_(self) -> None:
        a, b = shape_of(self.input), shape_of(self.output)
        _expect(_numel(a) == _numel(b), self, f"cannot reshape {a} to {b}")


class PermuteBase(IRDLOperation):
    input = operand_def(TensorType)
    output = result_def(TensorType)
    order = attr_def(DenseArrayBase)

    def verify_(self) -> None:
        order = self.order.get_values()
        src = shape_of(self.input)
        _expect(sorted(order) == list(range(len(src))), self, f"order {order} is not a permutation")
        _expect(shape_of(self.output) == tuple(src[i] for i in order), self, "output shape mismatch")


class RopeBase(IRDLOperation):
    """Rotary embedding, rotate-half form: `x * cos + rotate_half(x) * sin`.

    input [B, L, heads, d]; weight0 (cos) and weight1 (sin) [B, L, 1, d], gathered by position id.
    """

    input = operand_def(TensorType)
    weight0 = operand_def(TensorType)
    weight1 = operand_def(TensorType)
    output = result_def(TensorType)

    def verify_(self) -> None:
        x, c, s = shape_of(self.input), shape_of(self.weight0), shape_of(self.weight1)
        _expect(len(x) == 4, self, f"input must be [B, L, heads, d], got {x}")
        want = (x[0], x[1], 1, x[3])
        _expect(len(x) == 4 and c == want and s == want, self, f"cos/sin must be {want} for input {x}")
        _expect(x[3] % 2 == 0, self, "head dim must be even")
        _expect(shape_of(self.output) == x, self, "output shape must equal input")


class FAttentionBase(IRDLOperation):
    """Grouped-query attention: softmax(q k^T * scale + mask) v, per head.

    queries [B, mq, q_head, dim], keys/values [B, mk, kv_head, dim], mask [B, 1, mq, mk] (additive),
    output [B, mq, q_head * dim]. Query head h reads KV head h // (q_head / kv_head).

    Tile attributes (set by the layer-group pass in `tpu`; they fix the order of the sums, so every
    executor computes these blocks, numerics/kernels.py): `tile_kvh` KV heads per block, `tile_q` query
    rows per block, `tile_k` keys per block, with an online softmax across key blocks (flash attention).
    """

    queries = operand_def(TensorType)
    keys = operand_def(TensorType)
    values = operand_def(TensorType)
    mask = operand_def(TensorType)
    output = result_def(TensorType)
    scale = attr_def(FloatAttr)
    batch = attr_def(IntegerAttr)
    q_head = attr_def(IntegerAttr)
    kv_head = attr_def(IntegerAttr)
    dim = attr_def(IntegerAttr)
    mq = attr_def(IntegerAttr)
    mk = attr_def(IntegerAttr)
    tile_kvh = opt_attr_def(IntegerAttr)
    tile_q = opt_attr_def(IntegerAttr)
    tile_k = opt_attr_def(IntegerAttr)

    def verify_(self) -> None:
        for name, tile in (("tile_kvh", self.tile_kvh), ("tile_q", self.tile_q), ("tile_k", self.tile_k)):
            _expect(tile is None or tile.value.data > 0, self, f"{name} must be > 0")
        b, mq, mk = self.batch.value.data, self.mq.value.data, self.mk.value.data
        qh, kvh, d = self.q_head.value.data, self.kv_head.value.data, self.dim.value.data
        _expect(qh > 0 and kvh > 0 and qh % kvh == 0, self, f"q_head {qh} must be a multiple of kv_head {kvh}")
        _expect(shape_of(self.queries) == (b, mq, qh, d), self, "queries shape mismatch")
        _expect(shape_of(self.keys) == (b, mk, kvh, d), self, "keys shape mismatch")
        _expect(shape_of(self.values) == (b, mk, kvh, d), self, "values shape mismatch")
        _expect(shape_of(self.mask) == (b, 1, mq, mk), self, "mask shape mismatch")
        _expect(shape_of(self.output) == (b, mq, qh * d), self, "output shape mismatch")


class L2NormBase(IRDLOperation):
    """`x * rsqrt(sum(x^2, -1) + eps)`: each row to unit length over the last axis."""

    input = operand_def(TensorType)
    output = result_def(TensorType)
    eps = attr_def(FloatAttr)

    def verify_(self) -> None:
        _expect(shape_of(self.output) == shape_of(self.input), self, "output shape must equal input")


class CausalConv1dBase(IRDLOperation):
    """A depthwise causal convolution along axis 1: input [B, T, C], weight [C, 1, K] (torch's depthwise
    Conv1d layout), `pad` rows of zeros before the input; output [B, T + pad - K + 1, C]."""

    input = operand_def(TensorType)
    weight = operand_def(TensorType)
    output = result_def(TensorType)
    pad = attr_def(IntegerAttr)

    def verify_(self) -> None:
        x, w, pad = shape_of(self.input), shape_of(self.weight), self.pad.value.data
        _expect(len(x) == 3, self, f"input must be [B, T, C], got {x}")
        _expect(len(w) == 3 and w[0] == x[2] and w[1] == 1, self, f"weight must be [{x[2]}, 1, K], got {w}")
        rows = x[1] + pad - w[2] + 1
        _expect(pad >= 0 and rows > 0, self, f"{x[1]} rows and pad {pad} are shorter than the kernel {w[2]}")
        _expect(shape_of(self.output) == (x[0], rows, x[2]), self, f"output must be {(x[0], rows, x[2])}")


class GatedDeltaRuleBase(IRDLOperation):
    """Linear attention by the gated delta rule (op_defs/gated_delta_rule.py): queries and keys [1, n, Hk, dk],
    values [1, n, Hv, dv], log decays `g` and write strengths `beta` [1, n, Hv], the carried state
    [1, Hv, dk, dv] (absent: zeros); output [1, dk + n, Hv, dv], the final state's dk rows and then the
    tokens' outputs."""

    queries = operand_def(TensorType)
    keys = operand_def(TensorType)
    values = operand_def(TensorType)
    g = operand_def(TensorType)
    beta = operand_def(TensorType)
    state = opt_operand_def(TensorType)
    output = result_def(TensorType)
    chunk_size = attr_def(IntegerAttr)
    scale = attr_def(FloatAttr)
    # Set by the layer-group pass when the op does not fit local memory whole: computed in blocks of this
    # many value heads (with their key heads), which fixes the sums both executors compute
    # (numerics/kernels.py).
    tile_vh = opt_attr_def(IntegerAttr)

    def verify_(self) -> None:
        q, k, v = shape_of(self.queries), shape_of(self.keys), shape_of(self.values)
        _expect(len(q) == 4 and q == k and q[0] == 1, self,
                f"queries and keys must be one shape [1, n, Hk, dk], got {q} and {k}")
        _expect(len(v) == 4 and v[:2] == q[:2] and v[2] % q[2] == 0, self,
                f"values must be [1, {q[1]}, Hv, dv] with Hv a multiple of {q[2]}, got {v}")
        gates = (1, q[1], v[2])
        _expect(shape_of(self.g) == gates and shape_of(self.beta) == gates, self, f"g and beta must be {gates}")
        if self.state is not None:
            want = (1, v[2], q[3], v[3])
            _expect(shape_of(self.state) == want, self, f"state must be {want}")
        _expect(self.chunk_size.value.data > 0, self, "chunk_size must be > 0")
        want = (1, q[3] + q[1], v[2], v[3])
        _expect(shape_of(self.output) == want, self, f"output must be {want}")


class ConcatBase(IRDLOperation):
    inputs = var_operand_def(TensorType)
    output = result_def(TensorType)
    axis = attr_def(IntegerAttr)

    def verify_(self) -> None:
        axis = self.axis.value.data
        shapes = [shape_of(v) for v in self.inputs]
        _expect(bool(shapes) and all(0 <= axis < len(s) for s in shapes), self, f"axis {axis} out of range")
        rest = {s[:axis] + s[axis + 1 :] for s in shapes}
        _expect(len(rest) == 1, self, f"inputs differ outside axis {axis}: {shapes}")
        total = sum(s[axis] for s in shapes)
        want = shapes[0][:axis] + (total,) + shapes[0][axis + 1 :]
        _expect(shape_of(self.output) == want, self, f"output should be {want}")


class ElementwiseBase(IRDLOperation):
    """n-ary elementwise op with numpy broadcasting."""

    inputs = var_operand_def(TensorType)
    output = result_def(TensorType)

    def verify_(self) -> None:
        _expect(len(self.inputs) >= 2, self, "needs at least two inputs")
        shapes = [shape_of(v) for v in self.inputs]
        try:
            out = tuple(np.broadcast_shapes(*shapes))
        except ValueError:
            out = None
        _expect(out is not None, self, f"input shapes {shapes} do not broadcast")
        _expect(shape_of(self.output) == out, self, f"output shape must be the broadcast shape {out}")


class UnaryBase(IRDLOperation):
    input = operand_def(TensorType)
    output = result_def(TensorType)

    def verify_(self) -> None:
        _expect(shape_of(self.input) == shape_of(self.output), self, "output shape must equal input")


class SoftmaxBase(UnaryBase):
    axis = attr_def(IntegerAttr)


class ActiveBase(UnaryBase):
    """TPU-MLIR's `Active`: an activation function chosen by `mode` (SILU, GELU)."""

    mode = attr_def(StringAttr)


class CastBase(UnaryBase):
    """Element type conversion with round-to-nearest-even."""

    round_mode = opt_attr_def(StringAttr)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n

"""A TopOp net from an ONNX graph: the vision tower of a vision-language model (`vit`).

Every shape comes from the graph (llmbuild.frontend.onnx_model gives each value its static shape); nothing
about a particular tower is assumed. Three patterns that ONNX spells as several nodes become one TopOp op,
as TPU-MLIR's ONNX frontend fuses them too:

- **attention**: `Transpose(Q) @ Transpose(K) [* or / a scalar] -> Softmax(-1) -> @ Transpose(V)`, heads
  on axis 2 of Q, K, V ([B, T, H, D]), becomes `top.FAttention` over those [B, T, H, D] values, with the
  additive mask an input of the net (`attention_mask`, [B, 1, T, T]: zeros for a tower without masking,
  the padding of a slice for one that has it). Transposes are kept lazy (composed, and dropped when they
  cancel), so the attention's own output transposes fold away.
- **GELU** (exact): `x / sqrt(2) -> Erf -> + 1 -> * 0.5 -> * x`, in any of the orders the exporters write,
  becomes `top.GELU`.
- **patch embedding**: a `Conv` whose stride equals its kernel and which has no padding is a product of
  non-overlapping patches: Reshape/Permute to [B, patches, C*kh*kw], `top.MatMul` by the kernel as a
  [O, C*kh*kw] matrix, and back to the Conv's [B, O, H', W'].

Constants become `top.Weight`s (`weights` holds their float32 values); a 2-D constant right operand of a
MatMul is stored transposed, [N, K], the layout every product of this compiler reads.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from xdsl.dialects.builtin import ModuleOp, StringAttr, f32, i32
from xdsl.ir import SSAValue

from llmbuild import LlmbuildError
from llmbuild.dialects import common, top
from llmbuild.frontend.onnx_model import OnnxGraph, OnnxNode
from llmbuild.importer.graph import TopGraph, tensor
from llmbuild.importer.onnx_patterns import fuse_gelu_tanh

MASK_INPUT = "attention_mask"
SQRT2 = math.sqrt(2.0)


@dataclass(frozen=True)
class Transposed:
    """`perm` of `source`, not yet materialized (a Permute is made only for a consumer that needs one)."""

    source: SSAValue
    perm: tuple[int, ...]


@dataclass(frozen=True)
class Scores:
    """q·kᵀ·scale (+ mask) of an attention whose q and k are [B, T, H, D]; `probs` once a softmax ran over it."""

    q: SSAValue
    k: SSAValue
    scale: float
    probs: bool = False
    mask: SSAValue | None = None  # an additive mask the graph adds (a net input), else the net's zero mask


@dataclass(frozen=True)
class GeluPart:
    """A piece of the exact GELU of `x`: "arg" x/√2, "erf", "1+erf", "half" (1+erf)/2, "x(1+erf)", "x/2"."""

    stage: str
    x: SSAValue


Value = SSAValue | Transposed | Scores | GeluPart


@dataclass
class OnnxImport:
    module: ModuleOp
    weights: dict[str, np.ndarray]
    input_names: list[str]
    output_names: list[str]


@dataclass
class _Importer:
    graph: OnnxGraph
    top: TopGraph
    values: dict[str, Value] = field(default_factory=dict)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    weight_values: dict[str, SSAValue] = field(default_factory=dict)
    mask: SSAValue | None = None
    readers: Counter[str] = field(default_factory=Counter)  # how many nodes (and graph outputs) read each value

    # ---- values --------------------------------------------------------------------------------------

    def fail(self, node: OnnxNode, what: str) -> LlmbuildError:
        return LlmbuildError(f"{self.graph.path}: node {node.name or node.op} ({node.op}): {what}")

    def const(self, name: str) -> np.ndarray | None:
        return self.graph.constants.get(name)

    def weight(self, key: str, value: np.ndarray) -> SSAValue:
        """A constant as a top.Weight (one per distinct name and layout; scalars become [1])."""
        value = np.ascontiguousarray(np.asarray(value, dtype=np.float32).reshape(value.shape or (1,)))
        name = re.sub(r"[^A-Za-z0-9_.]", "_", key).strip("_.") or "const"
        if name in self.weights and not np.array_equal(self.weights[name], value):
            name = f"{name}.{len(self.weights)}"
        if name not in self.weight_values:
            self.weights[name] = value
            self.weight_values[name] = self.top.weight(name, value.shape)
        return self.weight_values[name]

    def release(self, name: str) -> None:
        """Drop the graph's constant `name` once its last reader has run: a product's weight is stored
        transposed (a copy, where the exporter wrote it [K, N]), and a tower's float32 weights held twice
        over (2.2 GB each for SigLIP-400M) would double the step's peak."""
        self.readers[name] -= 1
        if self.readers[name] == 0:
            self.graph.constants.pop(name, None)

    def act(self, node: OnnxNode, name: str) -> SSAValue:
        """An input of `node` as an SSA value: a constant becomes a weight, a lazy transpose a Permute."""
        const = self.const(name)
        if const is not None:
            return self.weight(name, const)
        value = self.values.get(name)
        if value is None:
            raise self.fail(node, f"input {name!r} is produced by no node this importer ran")
        if isinstance(value, Transposed):
            return self.permute(value.source, value.perm, f"{name}")
        if isinstance(value, GeluPart) and value.stage == "x/2":
            return self.emit(top.MulOp, [[value.x, self.weight("half", np.array([0.5]))]],
                             common.shape_of(value.x), name)
        if isinstance(value, (Scores, GeluPart)):
            raise self.fail(node, f"input {name!r} is part of an attention or GELU pattern and used elsewhere "
                                  "(only the fused forms are supported)")
        return value

    def permute(self, x: SSAValue, perm: Sequence[int], loc: str) -> SSAValue:
        shape = common.shape_of(x)
        op = top.PermuteOp.build(operands=[x], result_types=[tensor([shape[p] for p in perm])],
                                 attributes={"order": common.i64_array(list(perm))})
        return self.top._add(op, loc)

    def emit(self, op_cls: type, operands: list, shape: Sequence[int], loc: str, **attrs) -> SSAValue:
        return self.top._add(op_cls.build(operands=operands, result_types=[tensor(shape)], attributes=attrs), loc)

    # ---- the walk ------------------------------------------------------------------------------------

    def run(self) -> OnnxImport:
        names = []
        for name, shape in self.graph.inputs.items():
            self.values[name] = self.top.arg(name, shape, i32 if name in self.graph.integer_inputs else f32)
            names.append(name)
        nodes = fuse_gelu_tanh(self.graph)
        self.readers.update([*(i for node in nodes for i in node.inputs), *self.graph.outputs])
        for node in nodes:
            handler: Callable[[OnnxNode], Value] | None = getattr(self, f"op_{node.op}", None)
            if handler is None:
                raise self.fail(node, "operator not supported by the ONNX importer (supported: "
                                      + ", ".join(sorted(n[3:] for n in dir(self) if n.startswith("op_"))) + ")")
            self.values[node.outputs[0]] = handler(node)
        outputs = [self.act(OnnxNode("Output", (o,), (), {}, o), o) for o in self.graph.outputs]
        if self.mask is not None:
            names.append(MASK_INPUT)
        module = self.top.finish(outputs, list(self.graph.outputs))
        return OnnxImport(module, self.weights, names, list(self.graph.outputs))

    def shape(self, name: str) -> tuple[int, ...]:
        return self.graph.shapes[name]

    # ---- operators -----------------------------------------------------------------------------------

    def op_Identity(self, node: OnnxNode) -> Value:
        return self.values[node.inputs[0]] if node.inputs[0] in self.values else self.act(node, node.inputs[0])

    def op_Transpose(self, node: OnnxNode) -> Value:
        src = self.values.get(node.inputs[0])
        perm = tuple(node.attrs.get("perm", range(len(self.shape(node.inputs[0])))[::-1]))
        if isinstance(src, Transposed):  # transpose of a transpose: one permutation
            perm, src_value = tuple(src.perm[p] for p in perm), src.source
        else:
            src_value = self.act(node, node.inputs[0])
        if perm == tuple(range(len(perm))):
            return src_value
        return Transposed(src_value, perm)

    def op_Reshape(self, node: OnnxNode) -> Value:
        x = self.act(node, node.inputs[0])
        out = self.shape(node.outputs[0])
        if common.shape_of(x) == out:
            return x
        return self.top.reshape(x, out, node.outputs[0])

    def op_MatMul(self, node: OnnxNode) -> Value:
        a, b = node.inputs
        right = self.const(b)
        if right is not None:
            if right.ndim != 2:
                raise self.fail(node, f"constant right operand of rank {right.ndim} (expected a [K, N] matrix)")
            x = self.act(node, a)
            weight = self.weight(f"{b}.T", right.T)
            self.release(b)
            return self.top.linear(x, weight, None, node.outputs[0])
        left_v, right_v = self.values.get(a), self.values.get(b)
        left = self.const(a)
        if left is not None and left.ndim == 4 and isinstance(right_v, Transposed) and right_v.perm == (0, 2, 3, 1):
            # Queries that are constants (a resampler's learned queries), already [B, H, T, D].
            q = self.weight(f"{a}.queries", np.ascontiguousarray(left.transpose(0, 2, 1, 3)))
            return Scores(q, right_v.source, 1.0)
        if isinstance(left_v, Transposed) and isinstance(right_v, Transposed) and left_v.perm == (0, 2, 1, 3) \
                and right_v.perm == (0, 2, 3, 1):  # q·kᵀ of an attention
            return Scores(left_v.source, right_v.source, 1.0)
        if isinstance(left_v, Scores) and left_v.probs and isinstance(right_v, Transposed) \
                and right_v.perm == (0, 2, 1, 3):
            return self.attention(node, left_v, right_v.source)
        raise self.fail(node, "a product of two activations outside the attention pattern "
                              "(softmax(Q Kᵀ · scale) V with heads on axis 2)")

    def attention(self, node: OnnxNode, probs: Scores, v: SSAValue) -> Value:
        b, t, h, d = common.shape_of(probs.q)
        mask = probs.mask
        if mask is None:
            if self.mask is None:
                self.mask = self.top.arg(MASK_INPUT, (b, 1, t, common.shape_of(probs.k)[1]))
            mask = self.mask
        out = self.top.attention(probs.q, probs.k, v, mask, probs.scale, node.outputs[0])
        # FAttention gives [B, T, H*D]; the graph's MatMul gives [B, H, T, D]: its own transposes follow.
        return Transposed(self.top.reshape(out, (b, t, h, d), f"{node.outputs[0]}.heads"), (0, 2, 1, 3))

    def scalar(self, name: str) -> float | None:
        c = self.const(name)
        return float(c.reshape(())) if c is not None and c.size == 1 else None

    def op_Mul(self, node: OnnxNode) -> Value:
        a, b = node.inputs
        va, vb = self.values.get(a), self.values.get(b)
        for lazy, c in ((va, self.scalar(b)), (vb, self.scalar(a))):
            if c is None:
                continue
            if isinstance(lazy, Scores) and not lazy.probs:
                return Scores(lazy.q, lazy.k, lazy.scale * c)
            if isinstance(lazy, GeluPart) and math.isclose(c, 0.5):
                if lazy.stage == "1+erf":
                    return GeluPart("half", lazy.x)
                if lazy.stage == "x(1+erf)":
                    return self.gelu(lazy.x, node)
            if isinstance(lazy, SSAValue) and math.isclose(c, 1 / SQRT2, rel_tol=1e-6) and self._only_users(
                    node, "Erf"):
                return GeluPart("arg", lazy)
            if isinstance(lazy, SSAValue) and math.isclose(c, 0.5) and self._only_users(node, "Mul"):
                return GeluPart("x/2", lazy)  # made a Mul after all when its user is not a GELU's (act)
        for lazy, other in ((va, vb), (vb, va)):
            if not isinstance(lazy, GeluPart):
                continue
            if other is lazy.x and lazy.stage == "1+erf":
                return GeluPart("x(1+erf)", lazy.x)
            if other is lazy.x and lazy.stage == "half":
                return self.gelu(lazy.x, node)
            if lazy.stage == "1+erf" and isinstance(other, GeluPart) and other.stage == "x/2" and other.x is lazy.x:
                return self.gelu(lazy.x, node)
        return self.elementwise(node, top.MulOp)

    def _only_users(self, node: OnnxNode, op: str) -> bool:
        """Whether every node reading `node`'s output is an `op` (so a lazy pattern piece may wait for it)."""
        users = [n for n in self.graph.nodes if node.outputs[0] in n.inputs]
        return bool(users) and all(n.op == op for n in users) and node.outputs[0] not in self.graph.outputs

    def op_Div(self, node: OnnxNode) -> Value:
        a, b = node.inputs
        c = self.scalar(b)
        va = self.values.get(a)
        if isinstance(va, Scores) and not va.probs and c is not None:
            return Scores(va.q, va.k, va.scale / c)
        if c is not None and math.isclose(c, SQRT2, rel_tol=1e-6) and isinstance(va, SSAValue) \
                and self._only_users(node, "Erf"):
            return GeluPart("arg", va)
        if c is not None:  # x / c as x * (1/c): the device multiplies
            x = self.act(node, a)
            return self.emit(top.MulOp, [[x, self.weight(f"{b}.reciprocal", np.array([1.0 / c]))]],
                             common.shape_of(x), node.outputs[0])
        raise self.fail(node, "division by a tensor (only division by a constant scalar is supported)")

    def op_Erf(self, node: OnnxNode) -> Value:
        v = self.values.get(node.inputs[0])
        if isinstance(v, GeluPart) and v.stage == "arg":
            return GeluPart("erf", v.x)
        raise self.fail(node, "Erf outside the exact GELU pattern x/2 * (1 + erf(x/sqrt(2)))")

    def gelu(self, x: SSAValue, node: OnnxNode) -> SSAValue:
        return self.emit(top.GELUOp, [x], common.shape_of(x), node.outputs[0])

    def op_GeluTanh(self, node: OnnxNode) -> Value:
        """A tanh GELU region (importer/onnx_patterns.py replaced it by this node)."""
        x = self.act(node, node.inputs[0])
        return self.emit(top.GELUTanhOp, [x], common.shape_of(x), node.outputs[0])

    def op_Tanh(self, node: OnnxNode) -> Value:
        raise self.fail(node, "Tanh outside the tanh GELU pattern x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))")

    def op_Gather(self, node: OnnxNode) -> Value:
        """Rows of a constant table by indices that are a net input (a tower's position ids)."""
        table = self.const(node.inputs[0])
        index = node.inputs[1]
        if table is None or index not in self.graph.integer_inputs:
            raise self.fail(node, "a Gather other than rows of a constant table by an integer net input")
        axis = int(node.attrs.get("axis", 0)) % table.ndim
        indices = self.values[index]
        assert isinstance(indices, SSAValue)
        return self.top.gather(self.weight(node.inputs[0], table), indices, node.outputs[0], axis)

    def op_Add(self, node: OnnxNode) -> Value:
        a, b = node.inputs
        va, vb = self.values.get(a), self.values.get(b)
        for lazy, c in ((va, self.scalar(b)), (vb, self.scalar(a))):
            if isinstance(lazy, GeluPart) and lazy.stage == "erf" and c is not None and math.isclose(c, 1.0):
                return GeluPart("1+erf", lazy.x)
        for lazy, other in ((va, b), (vb, a)):
            if isinstance(lazy, Scores) and not lazy.probs and lazy.mask is None and other in self.graph.inputs:
                return self.masked(node, lazy, other)
        return self.elementwise(node, top.AddOp)

    def masked(self, node: OnnxNode, scores: Scores, name: str) -> Scores:
        """Scores plus an additive mask that is a net input of shape [B, 1, T, S] (a padded slice's)."""
        b, t, _, _ = common.shape_of(scores.q)
        want = (b, 1, t, common.shape_of(scores.k)[1])
        if self.graph.inputs[name] != want:
            raise self.fail(node, f"attention mask {name!r} of shape {list(self.graph.inputs[name])} (expected "
                                  f"{list(want)}: [batch, 1, queries, keys])")
        value = self.values[name]
        assert isinstance(value, SSAValue)
        return Scores(scores.q, scores.k, scores.scale, mask=value)

    def op_Sub(self, node: OnnxNode) -> Value:
        a, b = node.inputs
        c = self.scalar(b)
        if c is None:
            raise self.fail(node, "subtraction of a tensor (only of a constant scalar is supported)")
        x = self.act(node, a)
        return self.emit(top.AddOp, [[x, self.weight(f"{b}.negated", np.array([-c]))]], common.shape_of(x),
                         node.outputs[0])

    def elementwise(self, node: OnnxNode, op_cls: type) -> SSAValue:
        xs = [self.act(node, i) for i in node.inputs]
        shape = self.shape(node.outputs[0])
        return self.emit(op_cls, [xs], shape, node.outputs[0])

    def op_Softmax(self, node: OnnxNode) -> Value:
        v = self.values.get(node.inputs[0])
        axis = node.attrs.get("axis", -1)
        if isinstance(v, Scores) and axis in (-1, 3):
            return Scores(v.q, v.k, v.scale, probs=True, mask=v.mask)
        x = self.act(node, node.inputs[0])
        return self.emit(top.SoftmaxOp, [x], common.shape_of(x), node.outputs[0], axis=common.i64_attr(axis))

    def op_LayerNormalization(self, node: OnnxNode) -> Value:
        x = self.act(node, node.inputs[0])
        shape = common.shape_of(x)
        if node.attrs.get("axis", -1) not in (-1, len(shape) - 1):
            raise self.fail(node, f"normalization over axis {node.attrs['axis']} (only the last axis is supported)")
        gamma = self.act(node, node.inputs[1])
        beta_name = node.inputs[2] if len(node.inputs) > 2 else ""
        beta = self.act(node, beta_name) if beta_name else self.weight(f"{node.outputs[0]}.zero_bias",
                                                                       np.zeros(shape[-1:], np.float32))
        return self.emit(top.LayerNormOp, [x, gamma, beta], shape, node.outputs[0],
                         eps=common.f64_attr(float(node.attrs.get("epsilon", 1e-5))))

    def op_Concat(self, node: OnnxNode) -> Value:
        xs = [self.act(node, i) for i in node.inputs]
        axis = node.attrs["axis"] % len(common.shape_of(xs[0]))
        return self.top.concat(xs, axis, node.outputs[0])

    def op_Slice(self, node: OnnxNode) -> Value:
        x = self.act(node, node.inputs[0])
        shape = common.shape_of(x)
        starts, ends = self.const(node.inputs[1]), self.const(node.inputs[2])
        axes = self.const(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else np.arange(len(starts))
        steps = self.const(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] else np.ones(len(starts))
        if starts is None or ends is None or axes is None or steps is None:
            raise self.fail(node, "slice bounds computed at run time (only constant bounds are supported)")
        out = x
        for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
            axis = int(axis) % len(shape)
            lo, hi, st = slice(int(start), int(end), int(step)).indices(shape[axis])
            if st != 1:
                raise self.fail(node, f"slice step {st} (only step 1 is supported)")
            if (lo, hi) == (0, shape[axis]):
                continue
            cur = common.shape_of(out)
            new = cur[:axis] + (hi - lo,) + cur[axis + 1 :]
            out = self.emit(top.SliceOp, [out], new, node.outputs[0], axis=common.i64_attr(axis),
                            start=common.i64_attr(lo), end=common.i64_attr(hi))
        return out

    def op_Conv(self, node: OnnxNode) -> Value:
        weight = self.const(node.inputs[1])
        if weight is None or weight.ndim != 4:
            raise self.fail(node, "a Conv whose kernel is not a constant 2-D kernel")
        o, c, kh, kw = weight.shape
        strides = tuple(node.attrs.get("strides", (1, 1)))
        pads = tuple(node.attrs.get("pads", (0, 0, 0, 0)))
        if strides != (kh, kw) or any(pads) or node.attrs.get("group", 1) != 1 or \
                tuple(node.attrs.get("dilations", (1, 1))) != (1, 1):
            raise self.fail(node, f"a Conv with stride {strides}, pads {pads}: only non-overlapping patches "
                                  "(stride equal to the kernel, no padding, one group) are supported")
        x = self.act(node, node.inputs[0])
        b, _, h, w = common.shape_of(x)
        gh, gw = h // kh, w // kw
        loc = node.outputs[0]
        if (gh * kh, gw * kw) != (h, w):
            x = self.emit(top.SliceOp, [x], (b, c, gh * kh, w), f"{loc}.crop_h", axis=common.i64_attr(2),
                          start=common.i64_attr(0), end=common.i64_attr(gh * kh)) if gh * kh != h else x
            x = self.emit(top.SliceOp, [x], (b, c, gh * kh, gw * kw), f"{loc}.crop_w", axis=common.i64_attr(3),
                          start=common.i64_attr(0), end=common.i64_attr(gw * kw)) if gw * kw != w else x
        patches = self.top.reshape(x, (b, c, gh, kh, gw, kw), f"{loc}.grid")
        patches = self.permute(patches, (0, 2, 4, 1, 3, 5), f"{loc}.patches")
        patches = self.top.reshape(patches, (b, gh * gw, c * kh * kw), f"{loc}.rows")
        bias = self.act(node, node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
        kernel = self.weight(f"{node.inputs[1]}.matrix", weight.reshape(o, c * kh * kw))
        y = self.top.linear(patches, kernel, bias, f"{loc}.product")
        return self.top.reshape(self.permute(y, (0, 2, 1), f"{loc}.channels"), (b, o, gh, gw), loc)


def import_onnx_net(graph: OnnxGraph, net: str, attrs: dict | None = None) -> OnnxImport:
    """The TopOp module of `graph` as net `net` (`top.net` = net), and its weights. The graph is spent: each
    constant a product has taken as its transposed weight leaves `graph.constants`."""
    module_attrs = {"top.net": StringAttr(net), **(attrs or {})}
    return _Importer(graph, TopGraph(net, module_attrs)).run()

"""A small builder that appends `top` ops to a function and infers their result types."""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    IntegerType,
    ModuleOp,
    Signedness,
    StringAttr,
    TensorType,
    f32,
    i32,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from llmbuild.dialects import common, top

ui8 = IntegerType(8, Signedness.UNSIGNED)


def tensor(shape: Sequence[int], element: Attribute = f32) -> TensorType:
    return TensorType(element, list(shape))


class TopGraph:
    """Builds one net: `graph.arg(...)`, ops, then `graph.finish(outputs)` gives the module."""

    def __init__(self, net: str, attrs: dict[str, Attribute]):
        self.net = net
        self.attrs = attrs
        self.arg_types: list[TensorType] = []
        self.arg_names: list[str] = []
        self.ops: list[Operation] = []
        self.block = Block()

    def _add(self, op: Operation, loc: str) -> SSAValue:
        op.attributes["loc"] = StringAttr(loc)
        self.ops.append(op)
        return op.results[0]

    def arg(self, name: str, shape: Sequence[int], element: Attribute = f32) -> SSAValue:
        t = tensor(shape, element)
        value = self.block.insert_arg(t, len(self.arg_types))
        self.arg_types.append(t)
        self.arg_names.append(name)
        return self._add(top.InputOp.build(operands=[value], result_types=[t]), name)

    def weight(self, name: str, shape: Sequence[int], element: Attribute = f32) -> SSAValue:
        op = top.WeightOp.build(result_types=[tensor(shape, element)], attributes={"name": StringAttr(name)})
        return self._add(op, name)

    def gather(self, table: SSAValue, indices: SSAValue, loc: str, axis: int = 0) -> SSAValue:
        src, idx = common.shape_of(table), common.shape_of(indices)
        shape = src[:axis] + idx + src[axis + 1 :]
        op = top.GatherOp.build(
            operands=[table, indices], result_types=[tensor(shape)], attributes={"axis": common.i64_attr(axis)}
        )
        return self._add(op, loc)

    def rms_norm(self, x: SSAValue, gamma: SSAValue, eps: float, loc: str) -> SSAValue:
        op = top.RMSNormOp.build(
            operands=[x, gamma], result_types=[x.type], attributes={"eps": common.f64_attr(eps)}
        )
        return self._add(op, loc)

    def linear(self, x: SSAValue, weight: SSAValue, bias: SSAValue | None, loc: str) -> SSAValue:
        """x @ weight^T (+ bias): weights keep the checkpoint's [out, in] layout, right_transpose."""
        n = common.shape_of(weight)[0]
        shape = common.shape_of(x)[:-1] + (n,)
        op = top.MatMulOp.build(
            operands=[x, weight, [bias] if bias is not None else []],
            result_types=[tensor(shape)],
            attributes={"right_transpose": common.bool_attr(True), "do_relu": common.bool_attr(False)},
        )
        return self._add(op, loc)

    def quantized_weight(self, name: str, n: int, k: int, group: int) -> tuple[SSAValue, SSAValue, SSAValue]:
        """`{name}.qweight` levels [N, K] (one per element in top), `.scales` and `.zeros` [N, K/g]."""
        qweight = self._add(top.WeightOp.build(result_types=[tensor((n, k), ui8)],
                                               attributes={"name": StringAttr(f"{name}.qweight")}), f"{name}.qweight")
        return qweight, self.weight(f"{name}.scales", (n, k // group)), self.weight(f"{name}.zeros", (n, k // group))

    def a16_linear(self, x: SSAValue, name: str, n: int, k: int, group: int, bits: int, bias: SSAValue | None,
                   loc: str) -> SSAValue:
        """x @ dequant(levels)^T (+ bias) over the quantized weight `name`."""
        qweight, scales, zeros = self.quantized_weight(name, n, k, group)
        op = top.A16MatMulOp.build(
            operands=[x, qweight, scales, zeros, [bias] if bias is not None else []],
            result_types=[tensor(common.shape_of(x)[:-1] + (n,))],
            attributes={"weight_bits": common.i64_attr(bits), "q_group_size": common.i64_attr(group)},
        )
        return self._add(op, loc)

    def a16_gather(self, name: str, rows: int, width: int, group: int, bits: int, ids: SSAValue,
                   loc: str) -> SSAValue:
        """Rows `ids` of the dequantized table `name` ([rows, width], quantized along width)."""
        qweight, scales, zeros = self.quantized_weight(name, rows, width, group)
        op = top.A16GatherOp.build(
            operands=[qweight, scales, zeros, ids],
            result_types=[tensor(common.shape_of(ids) + (width,))],
            attributes={"weight_bits": common.i64_attr(bits), "q_group_size": common.i64_attr(group)},
        )
        return self._add(op, loc)

    def reshape(self, x: SSAValue, shape: Sequence[int], loc: str) -> SSAValue:
        return self._add(top.ReshapeOp.build(operands=[x], result_types=[tensor(shape)]), loc)

    def rope(self, x: SSAValue, cos: SSAValue, sin: SSAValue, loc: str) -> SSAValue:
        return self._add(top.RopeOp.build(operands=[x, cos, sin], result_types=[x.type]), loc)

    def attention(
        self, q: SSAValue, k: SSAValue, v: SSAValue, mask: SSAValue, scale: float, loc: str
    ) -> SSAValue:
        b, mq, qh, d = common.shape_of(q)
        _, mk, kvh, _ = common.shape_of(k)
        attrs = {
            "scale": common.f64_attr(scale),
            "batch": common.i64_attr(b),
            "q_head": common.i64_attr(qh),
            "kv_head": common.i64_attr(kvh),
            "dim": common.i64_attr(d),
            "mq": common.i64_attr(mq),
            "mk": common.i64_attr(mk),
        }
        op = top.FAttentionOp.build(
            operands=[q, k, v, mask], result_types=[tensor((b, mq, qh * d))], attributes=attrs
        )
        return self._add(op, loc)

    def concat(self, xs: Sequence[SSAValue], axis: int, loc: str) -> SSAValue:
        shapes = [common.shape_of(x) for x in xs]
        shape = shapes[0][:axis] + (sum(s[axis] for s in shapes),) + shapes[0][axis + 1 :]
        op = top.ConcatOp.build(
            operands=[list(xs)], result_types=[tensor(shape)], attributes={"axis": common.i64_attr(axis)}
        )
        return self._add(op, loc)

    def add(self, a: SSAValue, b: SSAValue, loc: str) -> SSAValue:
        return self._add(top.AddOp.build(operands=[[a, b]], result_types=[a.type]), loc)

    def mul(self, a: SSAValue, b: SSAValue, loc: str) -> SSAValue:
        return self._add(top.MulOp.build(operands=[[a, b]], result_types=[a.type]), loc)

    def silu(self, x: SSAValue, loc: str) -> SSAValue:
        return self._add(top.SiLUOp.build(operands=[x], result_types=[x.type]), loc)

    def sigmoid(self, x: SSAValue, loc: str) -> SSAValue:
        return self._add(top.SigmoidOp.build(operands=[x], result_types=[x.type]), loc)

    def softplus(self, x: SSAValue, loc: str) -> SSAValue:
        return self._add(top.SoftplusOp.build(operands=[x], result_types=[x.type]), loc)

    def slice(self, x: SSAValue, axis: int, start: int, end: int, loc: str) -> SSAValue:
        shape = list(common.shape_of(x))
        shape[axis] = end - start
        attrs = {"axis": common.i64_attr(axis), "start": common.i64_attr(start), "end": common.i64_attr(end)}
        return self._add(top.SliceOp.build(operands=[x], result_types=[tensor(shape)], attributes=attrs), loc)

    def permute(self, x: SSAValue, order: Sequence[int], loc: str) -> SSAValue:
        shape = common.shape_of(x)
        op = top.PermuteOp.build(operands=[x], result_types=[tensor([shape[i] for i in order])],
                                 attributes={"order": common.i64_array(order)})
        return self._add(op, loc)

    def l2_norm(self, x: SSAValue, eps: float, loc: str) -> SSAValue:
        op = top.L2NormOp.build(operands=[x], result_types=[x.type], attributes={"eps": common.f64_attr(eps)})
        return self._add(op, loc)

    def causal_conv1d(self, x: SSAValue, weight: SSAValue, pad: int, loc: str) -> SSAValue:
        b, t, c = common.shape_of(x)
        rows = t + pad - common.shape_of(weight)[-1] + 1
        op = top.CausalConv1dOp.build(operands=[x, weight], result_types=[tensor((b, rows, c))],
                                      attributes={"pad": common.i64_attr(pad)})
        return self._add(op, loc)

    def gated_delta_rule(self, q: SSAValue, k: SSAValue, v: SSAValue, g: SSAValue, beta: SSAValue,
                         state: SSAValue | None, chunk_size: int, scale: float, loc: str) -> SSAValue:
        _, n, _, dk = common.shape_of(k)
        _, _, hv, dv = common.shape_of(v)
        op = top.GatedDeltaRuleOp.build(
            operands=[q, k, v, g, beta, [state] if state is not None else []],
            result_types=[tensor((1, dk + n, hv, dv))],
            attributes={"chunk_size": common.i64_attr(chunk_size), "scale": common.f64_attr(scale)},
        )
        return self._add(op, loc)

    def finish(self, outputs: Sequence[SSAValue], output_names: Sequence[str]) -> ModuleOp:
        self.block.add_ops([*self.ops, func.ReturnOp(*outputs)])
        fn_type = (self.arg_types, [o.type for o in outputs])
        fn = func.FuncOp(self.net, fn_type, Region(self.block))
        fn.attributes["arg_names"] = _str_array(self.arg_names)
        fn.attributes["result_names"] = _str_array(output_names)
        module = ModuleOp([fn])
        for key, value in self.attrs.items():
            module.attributes[key] = value
        module.verify()
        return module


def _str_array(names: Sequence[str]) -> Attribute:
    from xdsl.dialects.builtin import ArrayAttr

    return ArrayAttr([StringAttr(n) for n in names])


__all__ = ["TopGraph", "tensor", "i32"]

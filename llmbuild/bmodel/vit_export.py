"""The vision tower's TopOp net (`vit`, steps/vision.py's import of the tower's ONNX graph) printed as the
vendor's top module, as LLM-TPU's vision-language demos load it: one input, the tile's pixels
[1, 3, S, S] in float32, and one output, `image_tokens` [T, hidden] that the runtime copies into the
prompt's embeddings (the shape `llm_convert`'s InternVL converter gives its `vit` net).

Where the text nets follow the incumbent's names op for op (its bytes are the check), the tower follows
its graph: the exporter is generic over the ops the ONNX import makes (patch products, LayerNorm, GELU,
permutes, slices, concatenations, residual and layer-scale arithmetic) and keeps the graph's own names as
locations. Attention is written as its products and softmax, as the incumbent writes its towers' (the
fused op is for the decoder's causal shapes, and NaN in F32); an InternVL tower attends everywhere, so the
net's zero mask input is dropped, not added.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.dialects.func import FuncOp
from xdsl.ir import Operation, SSAValue

from llmbuild.bmodel import vendor_ir as ir
from llmbuild.bmodel.top_export import NetExporter
from llmbuild.dialects import common, top
from llmbuild.importer.onnx_net import MASK_INPUT

PIXELS_INPUT = "pixel_values"


def export_vit(module: ModuleOp, weights: Mapping[str, np.ndarray], weight_file: str) -> ir.VendorModule:
    """`module`: the vit TopOp net; `weights`: its float32 weights by name. The vendor module's `weights` are
    the npz contents (keys: the TopOp weight names)."""
    fn = next(op for op in module.ops if isinstance(op, FuncOp))
    return VitExporter("vit", weights, weight_file).run(fn)


class VitExporter(NetExporter):
    # only_merge false, as the incumbent's towers write it: the class token is a weight, which an in-place
    # concatenation (the decoder's K/V history) cannot place beside an activation.
    concat_attrs = {**ir.CONCAT, "only_merge": "false"}

    def __init__(self, net: str, weights: Mapping[str, np.ndarray], weight_file: str):
        super().__init__(net, weights, weight_file, None, None, explicit_attention=True)
        self.written: dict[str, ir.Value] = {}  # weights by name: one npz entry however many ops read it

    def run(self, fn: FuncOp) -> ir.VendorModule:
        for op in fn.body.block.ops:
            if isinstance(op, top.WeightOp):
                continue
            if op.name == "func.return":
                self.outputs(list(op.operands))
            else:
                self.translate(op)
        return self.out

    def loc(self, op: Operation) -> str:
        return op.attributes["loc"].data.lstrip("/")  # type: ignore[attr-defined]

    def weight_key(self, name: str) -> str:
        return name

    def operand(self, value: SSAValue) -> ir.Value:
        """An activation, or a weight read by an elementwise op or a concatenation (the class token, the
        position table, a layer scale): written once, with its name."""
        if not isinstance(value.owner, top.WeightOp):
            return super().operand(value)
        name, data = self.array(value)
        if name not in self.written:
            self.written[name] = self.out.weight(name, data)
        return self.written[name]

    def broadcast_operand(self, value: SSAValue, rank: int) -> ir.Value:
        """An elementwise operand; a weight of lower rank gets leading ones (the vendor broadcasts by rank)."""
        if isinstance(value.owner, top.WeightOp):
            name, data = self.array(value)
            if data.ndim < rank:
                key = f"{name}.r{rank}"
                if key not in self.written:
                    self.written[key] = self.out.weight(key, data.reshape((1,) * (rank - data.ndim) + data.shape))
                return self.written[key]
        return self.operand(value)

    def op_Input(self, op: top.InputOp) -> ir.Value | None:
        name = op.attributes["loc"].data  # type: ignore[attr-defined]
        if name == MASK_INPUT:
            return None  # every patch attends to every patch: no mask (attention_ops)
        if name != PIXELS_INPUT:
            raise self.fail(f"input {name!r}: the vit net takes {PIXELS_INPUT} only")
        return self.out.input(name, common.shape_of(op.results[0]))

    def op_Gather(self, op: top.GatherOp) -> ir.Value:
        """Rows of a weight table by indices the net computes or takes as input (a tower's position ids)."""
        table, indices = op.operands
        if not isinstance(table.owner, top.WeightOp) or isinstance(indices.owner, top.WeightOp):
            raise self.fail(f"{self.loc(op)}: expected a gather of a weight table's rows by activation indices")
        axis = op.attributes["axis"].value.data  # type: ignore[attr-defined]
        return self.out.op("top.Gather", [self.operand(table), self.operand(indices)], common.shape_of(op.results[0]),
                           self.loc(op), {**ir.GATHER, "axis": ir.si32(axis)})

    def op_MatMul(self, op: top.MatMulOp) -> ir.Value:
        if not op.attributes["right_transpose"].value.data:  # type: ignore[attr-defined]
            raise self.fail(f"{self.loc(op)}: expected a product by a stored [N, K] weight")
        return super().op_MatMul(op)

    def op_FAttention(self, op: top.FAttentionOp) -> ir.Value:
        mask = op.operands[3]
        if mask not in self.values and not (isinstance(mask.owner, top.InputOp)
                                            and mask.owner.attributes["loc"].data == MASK_INPUT):  # type: ignore[attr-defined]
            raise self.fail(f"{self.loc(op)}: attention's mask is neither an input nor computed")
        return self.attention_ops(op, self.values.get(mask))

    def _binary(self, name: str, op: Operation) -> ir.Value:
        shape = common.shape_of(op.results[0])
        operands = [self.broadcast_operand(v, len(shape)) for v in op.operands]
        return self.out.op(name, operands, shape, self.loc(op), ir.ELEMENTWISE)

    def op_Permute(self, op: top.PermuteOp) -> ir.Value:
        order = tuple(op.order.get_values())
        return self.out.op("top.Permute", [self.operand(op.operands[0])], common.shape_of(op.results[0]),
                           self.loc(op), {"order": ir.int_array(order)})

    def op_LayerNorm(self, op: top.LayerNormOp) -> ir.Value:
        x = op.operands[0]
        shape = common.shape_of(x)
        gamma = self.leading_ones(op.operands[1], len(shape))
        beta = self.leading_ones(op.operands[2], len(shape))
        attrs = {"axis": ir.si32(len(shape) - 1), "eps": ir.f64(op.eps.value.data),
                 "normalized_shape": ir.int_array(shape[-1:])}
        return self.out.op("top.LayerNorm", [self.operand(x), gamma, beta], shape, self.loc(op), attrs)

    def op_GELU(self, op: top.GELUOp) -> ir.Value:
        return self._gelu(op, "normal")

    def op_GELUTanh(self, op: top.GELUTanhOp) -> ir.Value:
        return self._gelu(op, "tanh")

    def _gelu(self, op: Operation, mode: str) -> ir.Value:
        # approx_mode pinned: "normal" is the exact (erf) form, "tanh" the approximation.
        return self.out.op("top.GELU", [self.operand(op.operands[0])], common.shape_of(op.results[0]),
                           self.loc(op), {"approx_mode": ir.string(mode), "round_mode": ir.string("HalfAwayFromZero")})

    def op_Slice(self, op: top.SliceOp) -> ir.Value:
        src = common.shape_of(op.operands[0])
        axis, start, end = (op.attributes[k].value.data for k in ("axis", "start", "end"))  # type: ignore[attr-defined]
        offset = [start if i == axis else 0 for i in range(len(src))]
        ends = [end if i == axis else d for i, d in enumerate(src)]
        attrs = {"offset": ir.int_array(offset), "steps": ir.int_array([1] * len(src)), "ends": ir.int_array(ends),
                 "hasparamConvert_axes": ir.int_array([axis])}
        none = self.out.none
        return self.out.op("top.Slice", [self.operand(op.operands[0]), none, none, none],
                           common.shape_of(op.results[0]), self.loc(op), attrs)

    def op_Softmax(self, op: top.SoftmaxOp) -> ir.Value:
        axis = op.attributes["axis"].value.data  # type: ignore[attr-defined]
        rank = len(common.shape_of(op.operands[0]))
        return self.out.op("top.Softmax", [self.operand(op.operands[0])], common.shape_of(op.results[0]),
                           self.loc(op), {"axis": ir.si32(axis % rank), "log": "false", "beta": ir.f64(1.0)})

    def outputs(self, values: list[SSAValue]) -> None:
        (features,) = [self.operand(v) for v in values]
        tokens = (int(np.prod(features.shape[:-1])), features.shape[-1])
        flat = self.out.op("top.Reshape", [features], tokens, "image_tokens",
                           {"flatten_start_dim": ir.i64(-1), "shape": ir.int_array(tokens)})
        self.out.output(flat)


__all__ = ["PIXELS_INPUT", "VitExporter", "export_vit"]


def exported_top_ops() -> frozenset[str]:
    """The top ops ("top.X") that the net and vision exporters translate to the vendor's top dialect."""
    return frozenset(f"top.{name[3:]}" for exporter in (NetExporter, VitExporter) for name in dir(exporter)
                     if name.startswith("op_"))

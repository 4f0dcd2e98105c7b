"""lower-top-to-tpu: choose the device's arithmetic for every tensor of a net.

In f32 mode nothing but the dialect changes. In bf16/f16 mode activations and weights take the mode's
element type, with two places where high precision is kept, as the chip allows:
- RoPE cos/sin tables stay f32 (angles lose too much in bf16), and so does every value computed only
  from them (the gathered rows); `tpu.Rope` reads bf16 activations with f32 tables;
- the `logits` output of `lm_head` is written as f32 from the f32 accumulator (sampling and argmax
  compare close logits; bf16 would make ties);
- a linear-attention layer's recurrent state stays f32: the gated delta rule's result, its input
  `state_recurrent` and its output `present_recurrent` (and the slices that only move it). The state sums
  every earlier token; stored in bf16 after each step, its rounding compounds over the conversation.
`top.Input` and `top.Weight` stay `top` ops with converted types, as in TPU-MLIR.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    FunctionType,
    ModuleOp,
    StringAttr,
    TensorType,
    bf16,
    f16,
    f32,
)
from xdsl.ir import Attribute, Operation
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter

from llmbuild import LlmbuildError
from llmbuild.dialects import tpu
from llmbuild.dialects.common import bool_attr
from llmbuild.dialects.plain import main_func, string_list
from llmbuild.importer.graph import ui8
from llmbuild.op_defs import OPS, OpDef
from llmbuild.quant.scheme import activation_dtype

MODE_ELEMENT = {"f32": f32, "bf16": bf16, "f16": f16}
HIGH_PRECISION_WEIGHTS = ("rope.cos", "rope.sin")
F32_OUTPUTS = ("logits", "present_recurrent")
F32_INPUTS = ("state_recurrent",)
F32_RESULTS = ("top.GatedDeltaRule",)



def lowering_table(defs: Iterable[OpDef], tpu_classes: Mapping[str, type[Operation]]) -> dict[str, type[Operation]]:
    """"top.X" -> the tpu class it lowers to, for every top form of `defs` (llmbuild/op_defs/)."""
    return {f"top.{form.name}": tpu_classes[f"tpu.{op.name}"] for op in defs for form in op.top_forms()}


TOP_TO_TPU = lowering_table(OPS, tpu.COMPUTE)
# String attributes a top op's lowering sets (the activations lowered to tpu.Active, with its mode).
LOWERING_ATTRS = {f"top.{form.name}": form.lowering_attrs for op in OPS for form in op.top_forms()
                  if form.lowering_attrs}
# Ops that only move data: they keep the precision of their (float) input.
DATA_MOVEMENT = tuple(f"top.{form.name}" for op in OPS if op.moves_data for form in op.top_forms())


def _packed_levels(weight: Operation) -> TensorType:
    """4-bit levels packed two per byte along K ([N, K/2]); 8-bit levels stay one per byte."""
    (user,) = {use.operation for use in weight.results[0].uses}
    t = weight.results[0].type
    n, k = t.get_shape()
    bits = user.attributes["weight_bits"].value.data
    return TensorType(ui8, [n, k // 2 if bits == 4 else k], t.encoding)


def _is_float(t: Attribute) -> bool:
    return isinstance(t, TensorType) and isinstance(t.element_type, Float32Type | BFloat16Type | Float16Type)


def _with_element(t: TensorType, element: Attribute) -> TensorType:
    return TensorType(element, t.get_shape(), t.encoding)


@dataclass(frozen=True)
class LowerTopToTpu(ModulePass):
    name = "lower-top-to-tpu"
    mode: str = "f32"
    chip: str = "bm1684x"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        act = activation_dtype(self.mode)
        if act not in MODE_ELEMENT:
            raise LlmbuildError(
                f"lower-top-to-tpu: mode {self.mode!r} has no activation type in {sorted(MODE_ELEMENT)}"
            )
        element = MODE_ELEMENT[act]
        fn = main_func(op)
        block = fn.body.block
        for name, arg in zip(string_list(fn.attributes["arg_names"]), block.args, strict=True):
            if _is_float(arg.type) and name not in F32_INPUTS:
                Rewriter.replace_value_with_new_type(arg, _with_element(arg.type, element))
        result_names = string_list(fn.attributes["result_names"])
        keep_f32_results = set()
        ret = block.last_op
        assert isinstance(ret, func.ReturnOp)
        for name, value in zip(result_names, ret.operands, strict=True):
            if name in F32_OUTPUTS:
                keep_f32_results.add(value)

        for old in list(block.ops):
            if isinstance(old, func.ReturnOp):
                continue
            result = old.results[0]
            new_type = self._result_type(old, element, keep_f32=result in keep_f32_results)
            if old.name in ("top.Input", "top.Weight"):
                if new_type != result.type:
                    Rewriter.replace_value_with_new_type(result, new_type)
                continue
            cls = TOP_TO_TPU.get(old.name)
            if cls is None:
                raise LlmbuildError(f"lower-top-to-tpu: no lowering for {old.name}")
            attrs = dict(old.attributes)
            for key, value in LOWERING_ATTRS.get(old.name, {}).items():
                attrs[key] = StringAttr(value)
            if old.name in ("top.A16MatMul", "top.A16Gather"):
                # the device reads packed levels and rounds the dequantized weight to the activation type
                attrs["packed"] = bool_attr(old.attributes["weight_bits"].value.data == 4)
                attrs["dequant_dtype"] = StringAttr(act)
            new = cls.create(
                operands=list(old.operands),
                result_types=[new_type],
                attributes=attrs,
                properties=dict(old.properties),
            )
            Rewriter.replace_op(old, new)

        fn.function_type = FunctionType.from_lists(
            [a.type for a in block.args], [v.type for v in ret.operands]
        )
        op.attributes["tpu.mode"] = StringAttr(self.mode)
        op.attributes["tpu.chip"] = StringAttr(self.chip)

    def _result_type(self, op: Operation, element: Attribute, keep_f32: bool) -> Attribute:
        t = op.results[0].type
        if op.name == "top.Input":  # the argument's own type (an f32 input stays f32)
            return _with_element(t, op.operands[0].type.element_type) if _is_float(t) else t
        if op.name == "top.Weight" and op.attributes["name"].data.endswith(".qweight"):
            return _packed_levels(op)
        if op.name == "top.Weight" and op.attributes["name"].data.endswith(".zeros"):
            return TensorType(ui8, t.get_shape(), t.encoding)  # zero points are integer levels: one byte
        if not _is_float(t):
            return t
        if keep_f32 or op.name in F32_RESULTS:
            return _with_element(t, f32)
        if op.name == "top.Weight" and op.attributes["name"].data in HIGH_PRECISION_WEIGHTS:
            return _with_element(t, f32)
        if op.name in DATA_MOVEMENT:
            floats = [v.type for v in op.operands if _is_float(v.type)]
            if floats and all(isinstance(ft.element_type, Float32Type) for ft in floats):
                return _with_element(t, f32)
        return _with_element(t, element)

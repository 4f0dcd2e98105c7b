"""Emit a net's `Program` (llmbuild/binary/program.py) from an address-assigned tpu module: the op list,
every op on global tensors; a Reshape whose result aliases its operand is a view and emits nothing."""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue

from llmbuild import LlmbuildError
from llmbuild.binary.program import OPCODE_OF, Instr, Program, TensorDesc
from llmbuild.dialects.plain import main_func, op_attrs, string_list, tensor_info


def from_module(module: ModuleOp) -> Program:
    fn = main_func(module)
    prog = Program(
        net=module.attributes["top.net"].data,
        stage=module.attributes["top.stage"].data,
        layer=module.attributes["top.layer"].value.data,
        activation_bytes=module.attributes["tpu.activation_bytes"].value.data,
    )
    if "tpu.lmem_bytes" in module.attributes:
        prog.lmem_bytes = module.attributes["tpu.lmem_bytes"].value.data
    ids: dict[SSAValue, int] = {}

    def tid(v: SSAValue) -> int:
        if v not in ids:
            info = tensor_info(v.type)
            if info.address is None:
                raise LlmbuildError(f"{prog.net}: tensor without an address; run assign-address first")
            ids[v] = len(prog.tensors)
            prog.tensors.append(TensorDesc(info.dtype, info.shape, info.address))
        return ids[v]

    block = fn.body.block
    for name, arg in zip(string_list(fn.attributes["arg_names"]), block.args, strict=True):
        prog.inputs.append((name, tid(arg)))
    for op in block.ops:
        if isinstance(op, func.ReturnOp):
            names = string_list(fn.attributes["result_names"])
            prog.outputs = [(n, tid(v)) for n, v in zip(names, op.operands, strict=True)]
            continue
        kind = op.name.split(".", 1)[1]
        result = op.results[0]
        if kind in ("Input", "Weight"):
            if kind == "Input":
                ids[result] = tid(op.operands[0])
            else:
                tid(result)
            continue
        if kind not in OPCODE_OF:
            raise LlmbuildError(f"{prog.net}: no code generation for {op.name}")
        operands = tuple(tid(v) for v in op.operands)
        out = tid(result)
        if kind == "Reshape" and prog.tensors[out].address == prog.tensors[operands[0]].address:
            continue  # a view of the same bytes
        attrs = op_attrs(op)
        if kind != "Reshape":
            attrs.pop("shape", None)
        prog.instrs.append(Instr(kind, operands, out, op.attributes["loc"].data, attrs))
    return prog

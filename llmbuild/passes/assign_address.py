"""assign-address: give every tensor of a tpu net its global-memory address (the type encoding).

Net inputs/outputs take the IO, KV-cache or weight buffer the memory plan binds them to. Reshapes and
`top.Input` alias their operand (the same bytes, no copy). Every other value is an activation, placed in
the activation region by liveness with first fit, so a buffer is reused as soon as its last reader ran.
The net's activation peak is recorded as the module attribute `tpu.activation_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import FunctionType, IntegerAttr, ModuleOp, TensorType, i64
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter

from llmbuild import LlmbuildError
from llmbuild.binary.memory_map import ACTIVATION_ALIGN, MemoryPlan, Slot, align
from llmbuild.dialects.plain import main_func, string_list, tensor_info


class _Aliases:
    """Union-find over SSA values that share one buffer."""

    def __init__(self) -> None:
        self.parent: dict[SSAValue, SSAValue] = {}

    def find(self, v: SSAValue) -> SSAValue:
        self.parent.setdefault(v, v)
        while self.parent[v] is not v:
            self.parent[v] = self.parent[self.parent[v]]
            v = self.parent[v]
        return v

    def union(self, a: SSAValue, b: SSAValue) -> None:
        self.parent[self.find(a)] = self.find(b)


def nbytes(v: SSAValue) -> int:
    info = tensor_info(v.type)
    return Slot(0, info.dtype, info.shape).nbytes


@dataclass(frozen=True)
class AssignAddress(ModulePass):
    name = "assign-address"
    plan: str = "plan.json"  # path of the memory plan written by `llmbuild plan`

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        assign_addresses(op, MemoryPlan.read(Path(self.plan)))


def assign_addresses(module: ModuleOp, plan: MemoryPlan) -> int:
    fn = main_func(module)
    block = fn.body.block
    net = module.attributes["top.net"].data
    layer = module.attributes["top.layer"].value.data
    ops = list(block.ops)
    ret = ops[-1]
    assert isinstance(ret, func.ReturnOp)

    aliases = _Aliases()
    fixed: dict[SSAValue, int] = {}

    def bind(value: SSAValue, slot: Slot, what: str) -> None:
        info = tensor_info(value.type)
        if info.dtype != slot.dtype or nbytes(value) > slot.nbytes:
            raise LlmbuildError(f"{net}: {what} {info.dtype}{list(info.shape)} does not fit its buffer {slot}")
        fixed[value] = slot.address

    for name, arg in zip(string_list(fn.attributes["arg_names"]), block.args, strict=True):
        slot = plan.hidden_binding(layer, False) if name == "hidden_states" and layer >= 0 else plan.binding(
            net, layer, name
        )
        bind(arg, slot, f"input {name}")
    for name, value in zip(string_list(fn.attributes["result_names"]), ret.operands, strict=True):
        slot = plan.hidden_binding(layer, True) if name == "hidden_states" and layer >= 0 else plan.binding(
            net, layer, name
        )
        bind(value, slot, f"output {name}")
    for o in ops:
        if o.name == "top.Weight":
            wname = o.attributes["name"].data
            if wname not in plan.weights:
                raise LlmbuildError(f"{net}: weight {wname} is not in the memory plan")
            bind(o.results[0], plan.weights[wname], f"weight {wname}")
        elif o.name in ("top.Input", "tpu.Reshape"):
            aliases.union(o.results[0], o.operands[0])

    # Group addresses: a group with a fixed member takes that address.
    group_addr: dict[SSAValue, int] = {}
    for value, addr in fixed.items():
        root = aliases.find(value)
        if group_addr.setdefault(root, addr) != addr:
            raise LlmbuildError(f"{net}: one buffer is bound to two addresses ({group_addr[root]} and {addr})")

    # Liveness of the remaining groups: [first definition, last use] in op order.
    live: dict[SSAValue, list[int]] = {}
    for index, o in enumerate(ops):
        for v in o.operands:
            root = aliases.find(v)
            if root not in group_addr and root in live:
                live[root][1] = index
        for r in o.results:
            root = aliases.find(r)
            if root not in group_addr:
                live.setdefault(root, [index, index])
    sizes: dict[SSAValue, int] = {}
    for v in list(aliases.parent):
        root = aliases.find(v)
        if root in live:
            sizes[root] = max(sizes.get(root, 0), nbytes(v))

    peak = _first_fit(live, sizes, plan.activation_base, group_addr)

    # Write the addresses into the types (TPU-MLIR's convention: the tensor encoding).
    def address_of(v: SSAValue) -> int:
        return group_addr[aliases.find(v)]

    for arg in block.args:
        _set_address(arg, address_of(arg))
    for o in ops[:-1]:
        for r in o.results:
            _set_address(r, address_of(r))
    fn.function_type = FunctionType.from_lists([a.type for a in block.args], [v.type for v in ret.operands])
    module.attributes["tpu.activation_bytes"] = IntegerAttr(peak, i64)
    return peak


def _first_fit(
    live: dict[SSAValue, list[int]], sizes: dict[SSAValue, int], base: int, out: dict[SSAValue, int]
) -> int:
    """Place buffers in order of birth at the lowest offset free for their whole lifetime."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, start, end)
    peak = 0
    for root, (start, end) in sorted(live.items(), key=lambda kv: (kv[1][0], -sizes[kv[0]])):
        size = align(sizes[root], ACTIVATION_ALIGN)
        busy = sorted((o, o + s) for o, s, a, b in placed if not (b < start or a > end))
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append((offset, size, start, end))
        out[root] = base + offset
        peak = max(peak, offset + size)
    return peak


def _set_address(value: SSAValue, address: int) -> None:
    t = value.type
    assert isinstance(t, TensorType)
    new = TensorType(t.element_type, t.get_shape(), IntegerAttr(address, i64))
    if new != t:
        Rewriter.replace_value_with_new_type(value, new)



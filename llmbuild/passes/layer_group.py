"""plan-layer-groups and layer-group: cut an address-assigned tpu net into layer groups that run in
local memory.

`plan-layer-groups` makes the decisions (`layer_group_plan.py`), sets the tile attributes below on the
ungrouped ops and writes the plans as the module attribute `tpu.group_plans` (`layer_group_attr.py`).
`layer-group` reads that attribute and writes the groups into the IR, TPU-MLIR's way:

    %g:2 = "tpu.Group"() ({
      %x = "tpu.Load"(%in) {ginfo = {mode = "tile", axis = 1, lmem = array<i64: 0, 4096>}} : ...
      %w = "tpu.Load"(%wq) {ginfo = {mode = "stream", axis = 0, lmem = array<i64: 8192, 73728>}} : ...
      %y = "tpu.MatMul"(%x, %w) {..., tile_n = 896 : i64, ginfo = {lmem = array<i64: 139264>}} : ...
      %s = "tpu.Store"(%y) {ginfo = {mode = "whole"}} : ...
      "tpu.Yield"(%s) : ...
    }) {group = 0, rows = 1, tile_rows = 0, lmem_peak_bytes = 143360, stream_slot_bytes = 65536} : ...

Types keep the global shape and address of each value; `ginfo.lmem` is where the value (or each of its
ping-pong copies) sits in local memory. The compute op's `tile_m` / `tile_n` / `tile_kvh` / `tile_q` /
`tile_k` / `tile_vh` attributes say how the op is cut; they are also set on the ungrouped module, because
they fix the order of the floating-point sums (numerics/kernels.py), which both executors must share.

Flash attention (an attention with `tile_k`) in a group:

    %hk = "tpu.Load"(%history_k) {ginfo = {mode = "block", axis = 1, lmem = array<i64: A0, A1>}} : ...
    %k = "tpu.Load"(%k_new) {ginfo = {mode = "block", axis = 1, lmem = array<i64: A0, A1>}} : ...
    %m = "tpu.Load"(%mask) {ginfo = {mode = "block", axis = 3, row_axis = 2, lmem = array<i64: M0, M1>}} : ...
    %kc = "tpu.Concat"(%hk, %k) {axis = 1, ginfo = {mode = "block", lmem = array<i64: A0, A1>}} : ...
    %o = "tpu.FAttention"(%q, %kc, %vc, %m) {..., tile_q = 256, tile_k = 256,
           ginfo = {lmem = ..., scratch = array<i64: addr, bytes>, state = array<i64: addr, bytes>}} : ...

`mode = "block"` loads are cut per key block (along `axis`; the mask also along `row_axis` per row tile)
into the two slots of the attention operand they feed; a Concat with `mode = "block"` is computed per key
block into those slots (its inputs' blocks land side by side, so it copies only rows computed in the
group); `state` is the online softmax's running max, sum and accumulator (f32), kept from one key block
to the next. The group's `key_block` attribute repeats the attention's `tile_k`.

A gated delta rule in blocks of value heads (`tile_vh`), or a Slice or Permute of its result too large to
hold, is a group of its own with the block's heads as its `head_block` attribute: each operand is loaded
with `mode = "head"` (`axis`: where its heads are; a delta rule's queries and keys by the key heads the
block reads) into its two slots, and the result is stored per block with `mode = "head"` and its axis.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import DictionaryAttr, IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from llmbuild.chips import Chip, load_chip
from llmbuild.dialects import tpu
from llmbuild.dialects.common import i64_array, i64_attr
from llmbuild.dialects.plain import main_func, tensor_info
from llmbuild.passes.layer_group_attr import take_plans, write_plans
from llmbuild.passes.layer_group_plan import (
    MATMULS,
    GroupPlan,
    attention_scratch,
    flash_state_bytes,
    head_axes,
    plan_groups,
    streamed_operands,
)


@dataclass(frozen=True)
class PlanLayerGroups(ModulePass):
    """Decide the layer groups (layer_group_plan.py), set the tile attributes on the ops they cut and
    write the plans into the module (layer_group_attr.py) for `layer-group`."""

    name = "plan-layer-groups"
    chip: str = "bm1684x"
    lmem_bytes: int = 0  # 0: the chip's local memory; tests shrink it to force tiling

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        plans = plan_module(op, load_chip(self.chip), self.lmem_bytes or None)
        annotate_tiles(op, plans)
        write_plans(op, plans)


@dataclass(frozen=True)
class LayerGroup(ModulePass):
    """Rewrite the net into tpu.Group ops as the plans `plan-layer-groups` wrote say; it decides nothing."""

    name = "layer-group"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        group_module(op, take_plans(op))


def _token_rows(fn) -> list[int]:
    """The rows a vision net's attentions attend over (their queries), first seen first: [1] for a net
    without attention. A tower whose merger quarters its rows midway has two counts."""
    counts = [op.attributes["mq"].value.data for op in fn.body.block.ops  # type: ignore[attr-defined]
              if op.name == "tpu.FAttention"]
    return list(dict.fromkeys(counts)) or [1]


def plan_module(module: ModuleOp, chip: Chip, lmem_bytes: int | None = None) -> list[GroupPlan]:
    fn = main_func(module)
    stage = module.attributes["top.stage"].data  # type: ignore[attr-defined]
    net = module.attributes["top.net"].data  # type: ignore[attr-defined]
    first = tensor_info(fn.body.block.args[0].type).shape
    prefill = stage in ("prefill", "prefill_kv") or net == "embedding"
    rows = first[1] if prefill and len(first) >= 2 else 1
    other_rows: list[int] = []
    if stage == "vision":
        # A vision tower is a prefill over its patch tokens (InternViT-300M at 448 px: 1025 rows, whose MLP
        # alone is 16 MB in bf16): its token-major values are row-tiled like a layer's prompt rows.
        prefill = True
        rows, *other_rows = _token_rows(fn)
    lmem = lmem_bytes or chip.lmem_bytes
    module.attributes["tpu.lmem_bytes"] = IntegerAttr(lmem, i64)
    return plan_groups(fn, lmem, chip.npu_lanes * chip.eu_bytes, chip.npu_lanes, prefill, rows, net, other_rows)


def tile_attrs(plan: GroupPlan, op: Operation) -> dict[str, int]:
    out: dict[str, int] = {}
    if op.name in MATMULS:
        rows = 1
        for d in tensor_info(op.operands[0].type).shape[:-1]:
            rows *= d
        if plan.tile_rows and plan.tile_rows < rows:
            out["tile_m"] = plan.tile_rows
        tn = plan.tile_n.get(op)
        if tn and tn < tensor_info(op.operands[1].type).shape[0]:
            out["tile_n"] = tn
    if op in plan.tile_kvh:
        out["tile_kvh"] = plan.tile_kvh[op]
    if op in plan.tile_vh and op.name == "tpu.GatedDeltaRule":  # a Slice or Permute only moves values
        out["tile_vh"] = plan.tile_vh[op]
    if op in plan.tile_k:
        out["tile_k"] = plan.tile_k[op]
        if plan.tile_rows:
            out["tile_q"] = plan.tile_rows
    return out


def annotate_tiles(module: ModuleOp, plans: list[GroupPlan]) -> None:
    """Set tile_m / tile_n / tile_kvh / tile_q / tile_k on the ops `plans` (made on this module) cut."""
    for plan in plans:
        for op in plan.ops:
            for key, value in tile_attrs(plan, op).items():
                op.attributes[key] = i64_attr(value)
    module.attributes["tpu.groups"] = IntegerAttr(len(plans), i64)


def _ginfo(**items: Attribute) -> DictionaryAttr:
    return DictionaryAttr(dict(items))


def group_module(module: ModuleOp, plans: list[GroupPlan]) -> None:
    """Rewrite the module's body into tpu.Group ops (plans made on this very module)."""
    block = main_func(module).body.block
    # Inputs and weights first: a group reads them wherever they were declared.
    leaves = [op for op in block.ops if op.name in ("top.Input", "top.Weight")]
    anchor = block.first_op
    for op in leaves:
        if op is not anchor:
            op.detach()
            block.insert_op_before(op, anchor)  # type: ignore[arg-type]
        else:
            anchor = op.next_op
    moved: set[Operation] = set()
    renamed: dict[SSAValue, SSAValue] = {}  # values of groups already rewritten -> the group's result
    for plan in plans:
        group = _build_group(plan, renamed)
        block.insert_op_before(group, plan.ops[0])
        members = set(plan.ops)
        # A reshape of a value in global memory stays outside groups; it must precede its first reader.
        for op in plan.ops:
            for v in op.operands:
                owner = v.owner
                if (isinstance(owner, Operation) and owner.name == "tpu.Reshape" and owner not in members
                        and owner not in moved and owner.parent is block):
                    owner.detach()
                    block.insert_op_before(owner, group)
                    moved.add(owner)
        for old, new in zip(plan.stores, group.results, strict=True):
            old.replace_uses_with_if(new, lambda use, m=members: use.operation not in m)
            renamed[old] = new
        for op in reversed(plan.ops):
            op.detach()
            op.erase(safe_erase=False)


def _build_group(plan: GroupPlan, renamed: dict[SSAValue, SSAValue]) -> tpu.GroupOp:
    body = Block()
    mapping: dict[SSAValue, SSAValue] = {}
    blocks = plan.blocks
    for v, mode in plan.loads.items():
        info = {"mode": StringAttr(mode), "lmem": i64_array(plan.lmem[("load", v)])}
        if mode == "tile":
            info["axis"] = i64_attr(1)
        elif mode == "head":  # per block of heads (a delta rule's queries and keys: the key heads read)
            src = renamed.get(v, v)
            axes, _ = head_axes(plan.ops[0])  # type: ignore[misc]
            info["axis"] = i64_attr(axes[next(i for i, x in enumerate(plan.ops[0].operands) if x is src)])
        elif mode == "block":  # keys (tokens) of K/V rows, or of the mask's columns
            info["axis"] = i64_attr(3 if blocks[v] == 3 else 1)
            if blocks[v] == 3 and plan.tile_rows:
                info["row_axis"] = i64_attr(2)
        load = tpu.LoadOp(operands=[renamed.get(v, v)], result_types=[v.type], attributes={"ginfo": _ginfo(**info)})
        body.add_op(load)
        mapping[renamed.get(v, v)] = load.results[0]  # the ops now read the earlier group's result
    stored: list[SSAValue] = []
    store_mode = "tile" if plan.tile_rows else "head" if plan.tile_vh else "whole"
    for op in plan.ops:
        local = dict(mapping)
        if op in plan.tile_n:
            for i in streamed_operands(op):
                if i < len(op.operands):
                    load = tpu.LoadOp(
                        operands=[renamed.get(op.operands[i], op.operands[i])], result_types=[op.operands[i].type],
                        attributes={"ginfo": _ginfo(mode=StringAttr("stream"), axis=i64_attr(0),
                                                    lmem=i64_array(plan.lmem[("stream", op, i)]))},
                    )
                    body.add_op(load)
                    local[op.operands[i]] = load.results[0]
        new = op.clone(value_mapper=local)
        new.attributes["ginfo"] = _ginfo(**_compute_info(plan, op))
        body.add_op(new)
        mapping[op.results[0]] = new.results[0]
        if op.results[0] in plan.stores:
            where = {"axis": i64_attr(head_axes(op)[1])} if plan.tile_vh else {}  # type: ignore[index]
            store = tpu.StoreOp(operands=[new.results[0]], result_types=[op.results[0].type],
                                attributes={"ginfo": _ginfo(mode=StringAttr(store_mode), **where)})
            body.add_op(store)
            stored.append(store.results[0])
    body.add_op(tpu.YieldOp(operands=[stored]))
    attrs = {
        "group": i64_attr(plan.index), "rows": i64_attr(plan.rows), "tile_rows": i64_attr(plan.tile_rows),
        "lmem_peak_bytes": i64_attr(plan.lmem_peak_bytes), "stream_slot_bytes": i64_attr(plan.stream_slot),
    }
    if plan.tile_k:
        attrs["key_block"] = i64_attr(max(plan.tile_k.values()))
    if plan.tile_vh:
        attrs["head_block"] = i64_attr(max(plan.tile_vh.values()))
    return tpu.GroupOp(result_types=[[v.type for v in plan.stores]], regions=[Region(body)], attributes=attrs)


def _compute_info(plan: GroupPlan, op: Operation) -> dict[str, Attribute]:
    """ginfo of a compute op: where its result lives and, for attention, its scratch and state."""
    info: dict[str, Attribute] = {"lmem": i64_array(plan.lmem[("value", op.results[0])])}
    if op in plan.fused:
        info["mode"] = StringAttr("block")
    if ("scratch", op) in plan.lmem:
        rows = (plan.tile_rows or None) if op in plan.tile_k else None
        size = attention_scratch(op, plan.tile_kvh.get(op), rows, plan.tile_k.get(op))
        info["scratch"] = i64_array([plan.lmem[("scratch", op)][0], size])
    if ("state", op) in plan.lmem:
        info["state"] = i64_array([plan.lmem[("state", op)][0], flash_state_bytes(op, plan.tile_rows)])
    return info

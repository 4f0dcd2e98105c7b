"""Layer groups of one net: which consecutive ops share local memory, how each is tiled, and where every
buffer sits in local memory. `layer_group.py` writes the result into the IR; this file only decides.

Local memory is modelled as one byte array of npu_lanes x lmem_bytes_per_lane. A tensor is spread over
the lanes and takes at least one EU-aligned slot in every lane, so every buffer is a multiple of
npu_lanes x eu_bytes here (4 KiB on the BM1684X, 512 bytes on the BM1688).

Two policies, because the two kinds of stage are bound by different engines:
- decode (one token: `block_cache_i`, `embedding_cache`, `lm_head`) is bound by weight bandwidth. Every
  matmul streams its weight in slices of output rows (N) through two slots (double buffering: slice k+1
  loads while slice k computes, across op boundaries), activations stay whole, and as many ops as fit
  share one group, so nothing but weights crosses the DDR bus.
- prefill (L tokens: `block_i`, `block_kv_i`, `embedding`) is bound by compute. Weights are loaded whole
  once per group and reused by every row tile; activations are cut into row tiles (tokens) that are
  double-buffered so the next tile's load and this tile's store overlap compute. Ops that need every row
  of a value produced in the group (attention's keys and values, a concat along tokens) start a group
  without row tiles. A weight too large to be held streams as in decode.
Attention that does not fit is computed in blocks of KV heads (`tile_kvh`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from llmbuild import LlmbuildError
from llmbuild.dialects.plain import tensor_info
from llmbuild.numerics.formats import itemsize

ROW_BLOCK = 8  # row tiles are multiples of this many tokens
STREAM_FRACTION = 16  # one streamed weight slice holds at most lmem / 16 bytes
MATMULS = ("tpu.MatMul", "tpu.A16MatMul")
# Ops whose output row t depends only on row t of their activation operands (tokens on axis 1).
ROW_LOCAL = frozenset(
    {"tpu.RMSNorm", "tpu.MatMul", "tpu.A16MatMul", "tpu.Add", "tpu.Mul", "tpu.Active", "tpu.Cast", "tpu.Rope",
     "tpu.Gather", "tpu.A16Gather", "tpu.Reshape"}
)


def dma_tables(op: Operation) -> tuple[int, ...]:
    """Operands a lookup reads from global memory by DMA, row by row (an embedding or RoPE table;
    quantized: levels, scales, zero points): never loaded whole into local memory. A gather along the
    last axis (act order's activation permutation) is an ordinary row-local op."""
    if op.name == "tpu.A16Gather":
        return (0, 1, 2)
    if op.name == "tpu.Gather" and op.attributes["axis"].value.data == 0:  # type: ignore[attr-defined]
        return (0,)
    return ()


def nbytes(shape: Sequence[int], dtype: str) -> int:
    n = itemsize(dtype)
    for s in shape:
        n *= s
    return n


def value_bytes(v: SSAValue, rows: int | None = None) -> int:
    """Bytes of `v`, or of one row tile of `rows` tokens (axis 1)."""
    info = tensor_info(v.type)
    shape = list(info.shape)
    if rows is not None:
        shape[1] = rows
    return nbytes(shape, info.dtype)


def streamed_operands(op: Operation) -> list[int]:
    """Operand indices a matmul slices along N: the weight and what goes with each output row."""
    return [1, 2] if op.name == "tpu.MatMul" else [1, 2, 3, 4]


@dataclass
class GroupPlan:
    index: int
    ops: list[Operation]
    rows: int  # tokens of the net
    tile_rows: int  # rows per tile; 0: the group is not row-tiled
    tile_n: dict[Operation, int]  # streamed matmuls: weight rows per slice
    tile_kvh: dict[Operation, int]  # attention computed in blocks of this many KV heads
    loads: dict[SSAValue, str]  # external value -> "held" (whole, once) or "tile" (per row tile)
    stores: list[SSAValue]  # values later groups or the outputs read
    lmem: dict[tuple, tuple[int, ...]] = field(default_factory=dict)  # buffer key -> address(es)
    stream_slot: int = 0  # bytes of each of the two weight-stream slots
    lmem_peak_bytes: int = 0

    @property
    def row_tiles(self) -> int:
        return -(-self.rows // self.tile_rows) if self.tile_rows else 1


@dataclass
class NetInfo:
    lmem_bytes: int
    align: int  # buffer granularity in local memory
    lanes: int
    prefill: bool  # the policy (module docstring)
    rows: int  # tokens of the net (1 for decode)
    users: dict[SSAValue, list[Operation]]  # every op (and func.return) reading each value
    weights: set[SSAValue]  # results of top.Weight


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def row_local(op: Operation, rows: int) -> bool:
    if op.name not in ROW_LOCAL:
        return False
    values = [v for v in (*op.operands, *op.results) if len(tensor_info(v.type).shape) >= 2]
    tables = [op.operands[i] for i in dma_tables(op)]
    values = [v for v in values if v not in tables]
    return all(tensor_info(v.type).shape[1] == rows for v in values if not _is_weight_like(v))


def _is_weight_like(v: SSAValue) -> bool:
    owner = v.owner
    return isinstance(owner, Operation) and owner.name == "top.Weight"


def _slice_rows(total: int, row_bytes: int, target: int, lanes: int) -> int:
    """Weight rows per streamed slice: as many as `target` bytes hold, a multiple of the lanes."""
    n = max(1, target // max(row_bytes, 1))
    if n >= total:
        return total
    return max(lanes, n // lanes * lanes) if n >= lanes else n


def layout(net: NetInfo, index: int, ops: list[Operation], tile_rows: int, stream: bool,
           kvh_tile: int) -> GroupPlan | None:
    """Place every buffer of the group in local memory; None if it does not fit."""
    a = net.align
    inside = {r for op in ops for r in op.results}
    in_group = set(ops)
    loads: dict[SSAValue, str] = {}
    tile_n: dict[Operation, int] = {}
    tile_kvh: dict[Operation, int] = {}
    stream_parts: dict[tuple, int] = {}  # ("stream", op, operand) -> offset inside a slot
    slot = 0
    for op in ops:
        if op.name == "tpu.Reshape":
            continue
        if op.name == "tpu.FAttention":
            kvh = op.attributes["kv_head"].value.data  # type: ignore[attr-defined]
            if kvh_tile < kvh:
                tile_kvh[op] = kvh_tile
        sliced: list[int] = []
        if stream and op.name in MATMULS:
            sliced = [i for i in streamed_operands(op) if i < len(op.operands)]
            n = tensor_info(op.operands[1].type).shape[0]
            row_bytes = sum(value_bytes(op.operands[i]) // n for i in sliced)
            tn = _slice_rows(n, row_bytes, net.lmem_bytes // STREAM_FRACTION, net.lanes)
            tile_n[op] = tn
            offset = 0
            for i in sliced:
                stream_parts[("stream", op, i)] = offset
                offset += _align(value_bytes(op.operands[i]) // n * tn, a)
            slot = max(slot, offset)
        for i, v in enumerate(op.operands):
            if v in inside or i in sliced or i in dma_tables(op):
                continue
            tiled = tile_rows and not _is_weight_like(v) and tensor_info(v.type).shape[1:2] == (net.rows,)
            loads.setdefault(v, "tile" if tiled else "held")
    stores = [r for op in ops for r in op.results
              if any(u not in in_group for u in net.users.get(r, []))]

    # Pinned for the whole group: held loads, ping-pong row tiles in and out, the two stream slots.
    lmem: dict[tuple, tuple[int, ...]] = {}
    top = 0

    def pin(key: tuple, size: int, copies: int) -> None:
        nonlocal top
        addrs = []
        for _ in range(copies):
            addrs.append(top)
            top += _align(size, a)
        lmem[key] = tuple(addrs)

    for v, mode in loads.items():
        pin(("load", v), value_bytes(v, tile_rows if mode == "tile" else None), 2 if mode == "tile" else 1)
    stored = set(stores)
    if tile_rows:
        for v in stores:
            if not _alias_of_inside(v, inside):
                pin(("value", v), value_bytes(v, tile_rows), 2)
    if slot:
        slots = (top, top + slot)
        top += 2 * slot
        for key, off in stream_parts.items():
            lmem[key] = (slots[0] + off, slots[1] + off)

    # The rest by liveness inside the group (a tile's intermediates are reused by the next tile).
    base = top
    intervals: list[tuple[tuple, int, int, int]] = []  # key, size, first, last
    owner: dict[SSAValue, SSAValue] = {}  # reshape results share their operand's buffer
    first: dict[SSAValue, int] = {}
    last: dict[SSAValue, int] = {}
    size: dict[SSAValue, int] = {}
    for k, op in enumerate(ops):
        for v in op.operands:
            if v in inside:
                last[owner.get(v, v)] = k
        if op.name == "tpu.Reshape" and op.operands[0] in inside:
            root = owner.get(op.operands[0], op.operands[0])
            owner[op.results[0]] = root
            if op.results[0] in stored:
                last[root] = max(last.get(root, k), k)
            continue
        r = op.results[0]
        if tile_rows and r in stored:
            continue  # pinned above
        first[r], last[r] = k, k
        size[r] = value_bytes(r, tile_rows or None)
        if op.name == "tpu.FAttention":
            intervals.append((("scratch", op), attention_scratch(op, tile_kvh.get(op)), k, k))
    for r, f in first.items():
        intervals.append((("value", r), size[r], f, last[r]))
    peak = _first_fit(intervals, a, lmem, base)
    if peak > net.lmem_bytes:
        return None
    for v, root in owner.items():
        lmem[("value", v)] = lmem[("value", root)]
    # A streamed op with a single slice still streams: its load overlaps the previous op's compute.
    return GroupPlan(index, list(ops), net.rows, tile_rows, tile_n, tile_kvh, loads, stores, lmem, slot, peak)


def _alias_of_inside(v: SSAValue, inside: set[SSAValue]) -> bool:
    owner = v.owner
    return isinstance(owner, Operation) and owner.name == "tpu.Reshape" and owner.operands[0] in inside


def attention_scratch(op: Operation, kvh_tile: int | None) -> int:
    """Scores and probabilities of one block of heads, f32: what flash attention keeps in local memory."""
    q = tensor_info(op.operands[0].type).shape
    kvh = op.attributes["kv_head"].value.data  # type: ignore[attr-defined]
    mk = op.attributes["mk"].value.data  # type: ignore[attr-defined]
    heads = q[2] // kvh * (kvh_tile or kvh)
    return 2 * 4 * heads * q[1] * mk


def _first_fit(intervals: list[tuple[tuple, int, int, int]], a: int, out: dict, base: int) -> int:
    placed: list[tuple[int, int, int, int]] = []
    peak = base
    for key, size, start, end in sorted(intervals, key=lambda t: (t[2], -t[1])):
        size = _align(size, a)
        busy = sorted((o, o + s) for o, s, f, l in placed if not (l < start or f > end))
        offset = base
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append((offset, size, start, end))
        out[key] = (offset,)
        peak = max(peak, offset + size)
    return peak


def _tile_options(rows: int) -> list[int]:
    """Row tiles to try, largest first: two tiles at least when the rows allow (so loads overlap)."""
    if rows < 2 * ROW_BLOCK:
        return [rows]
    t = rows // 2 // ROW_BLOCK * ROW_BLOCK
    out = []
    while t >= ROW_BLOCK:
        out.append(t)
        t = t // 2 // ROW_BLOCK * ROW_BLOCK
    return out


def _kvh_options(ops: Iterable[Operation]) -> list[int]:
    heads = [op.attributes["kv_head"].value.data for op in ops if op.name == "tpu.FAttention"]  # type: ignore[attr-defined]
    if not heads:
        return [1]
    kvh = max(heads)
    return [d for d in range(kvh, 0, -1) if kvh % d == 0]


def plan_group(net: NetInfo, index: int, ops: list[Operation]) -> GroupPlan | None:
    """The first tiling, in order of preference, under which the group fits."""
    tiled = net.prefill and net.rows > 1 and all(row_local(op, net.rows) for op in ops)
    tiles = _tile_options(net.rows) if tiled else [0]
    for stream in ((True,) if not net.prefill else (False, True)):
        for t in tiles:
            for kvh in _kvh_options(ops):
                plan = layout(net, index, ops, t if t < net.rows else 0, stream, kvh)
                if plan is not None:
                    return plan
    return None


def plan_groups(fn: func.FuncOp, lmem_bytes: int, align: int, lanes: int, prefill: bool, rows: int,
                net_name: str) -> list[GroupPlan]:
    """Greedy: extend the current group while it fits; close it when the next op does not fit or, in
    prefill, when the next op changes between row-tiled and not, or would make the group stream weights
    it held until then."""
    block = fn.body.block
    users: dict[SSAValue, list[Operation]] = {}
    weights: set[SSAValue] = set()
    compute: list[Operation] = []
    for op in block.ops:
        for v in op.operands:
            users.setdefault(v, []).append(op)
        if op.name == "top.Weight":
            weights.add(op.results[0])
        elif op.name.startswith("tpu."):
            compute.append(op)
    net = NetInfo(lmem_bytes, align, lanes, prefill, rows, users, weights)
    groups: list[GroupPlan] = []
    current: list[Operation] = []
    plan: GroupPlan | None = None
    produced: set[SSAValue] = set()

    def close() -> None:
        nonlocal current, plan
        if current:
            assert plan is not None
            groups.append(plan)
        current, plan = [], None

    for op in compute:
        if op.name == "tpu.Reshape" and op.operands[0] not in produced:
            continue  # a view of a value in global memory: no work, no group
        if op.name == "tpu.Reshape" and current:
            current.append(op)
            produced.add(op.results[0])
            plan = plan_group(net, len(groups), current) or plan
            continue
        if current and prefill and row_local(op, rows) != row_local(current[-1], rows):
            close()
        candidate = plan_group(net, len(groups), [*current, op]) if current else None
        if candidate is not None and prefill and candidate.tile_n and plan is not None and not plan.tile_n:
            candidate = None  # prefill holds weights: a new group beats loading them again per row tile
        if candidate is None:
            close()
            candidate = plan_group(net, len(groups), [op])
            if candidate is None:
                raise LlmbuildError(
                    f"{net_name}: {op.attributes['loc'].data}: does not fit local memory ({lmem_bytes} bytes) "  # type: ignore[attr-defined]
                    "under any tiling the layer-group pass knows"
                )
        current.append(op)
        produced.update(op.results)
        plan = candidate
    close()
    for i, g in enumerate(groups):
        g.index = i
    return groups

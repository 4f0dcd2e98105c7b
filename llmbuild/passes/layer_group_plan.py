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
A gated delta rule (linear attention) that does not fit whole takes a group of its own, computed in blocks
of value heads (`head_layout`: heads are independent, each with its own state): every operand is loaded
per block (its heads, and the key heads they read) into two slots, and each block's result is stored
while the next computes. The Slices and the Permute that take its result apart (the state's rows, the
tokens' outputs), and the causal convolution and its window's Concat before it (channel by channel), are
cut the same way when they do not fit whole.
Attention that does not fit is computed in blocks of KV heads (`tile_kvh`); when one KV head does not fit
either, as flash attention (`flash_layout`): blocks of query rows (the group's row tiles, `tile_q`) and
blocks of keys (`tile_k`) with an online softmax. Its K/V blocks and mask tiles are loaded per key block
into two slots each (double buffering), a Concat of the KV history and the new rows that only the
attention reads is computed per key block into the same slots (the history is never held whole), and the
running max, sum and accumulator stay in local memory from one key block to the next.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from llmbuild import LlmbuildError
from llmbuild.dialects.plain import tensor_info
from llmbuild.numerics.formats import itemsize
from llmbuild.op_defs import OPS, OpDef
from llmbuild.op_defs.gated_delta_rule import block_sizes, head_block

ROW_BLOCK = 8  # row tiles are multiples of this many tokens
# Row tiles hold at most this many tokens. The chip gains little from larger ones (a group's weights are
# loaded once whatever the tile: the 1.5B's prefill at L = 2048 times 37.6 ms with 64-row tiles against
# 36.4 ms with 128 in the group timing), and every host executor must compute whole tiles to reproduce the
# chip's sums (BLAS rounds a row differently in a product of another height): a 20-token prompt then
# costs one tile of 64 rows, not 1024, in `llmbuild run`, and the build's checks of 64 tokens one tile.
MAX_ROW_TILE = 64
STREAM_FRACTION = 16  # one streamed weight slice holds at most lmem / 16 bytes
# Flash attention's key blocks: the pass prefers blocks of at least KEY_BLOCK_MIN keys (fewer, larger
# commands) and goes down to KEY_BLOCK_FLOOR only when nothing else fits; blocks are powers of two (or
# every key), so a block boundary falls on the end of a power-of-two KV history.
KEY_BLOCK_MIN = 256
KEY_BLOCK_FLOOR = 16
STATE_BYTES = 4  # the online softmax's running max, sum and accumulator are f32
# Products of an activation by a weight (cost "mac"): the planner tiles their rows and streams their weight.
MATMULS = tuple(f"tpu.{op.name}" for op in OPS if op.cost == "mac")
# Ops whose output row t depends only on row t of their activation operands (tokens on axis 1).


def row_local_ops(defs: Iterable[OpDef]) -> frozenset[str]:
    """The tpu ops of `defs` whose definition (llmbuild/op_defs/) says grouping "row_local"."""
    return frozenset(f"tpu.{op.name}" for op in defs if op.grouping == "row_local")


ROW_LOCAL = row_local_ops(OPS)


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
    # external value -> "held" (whole, once), "tile" (per row tile) or "block" (per key block of flash
    # attention, into the attention's key-block slots)
    loads: dict[SSAValue, str]
    stores: list[SSAValue]  # values later groups or the outputs read
    lmem: dict[tuple, tuple[int, ...]] = field(default_factory=dict)  # buffer key -> address(es)
    stream_slot: int = 0  # bytes of each of the two weight-stream slots
    lmem_peak_bytes: int = 0
    tile_k: dict[Operation, int] = field(default_factory=dict)  # flash attention: keys per block
    fused: list[Operation] = field(default_factory=list)  # concats computed per key block of the attention
    # values loaded per key block -> the attention operand whose slots they fill (1 keys, 2 values, 3 mask)
    blocks: dict[SSAValue, int] = field(default_factory=dict)
    tile_vh: dict[Operation, int] = field(default_factory=dict)  # an op alone in blocks of heads (head_axes)

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
    # A constant with a row per token (a vision tower's position embeddings, [1, tokens, width]) is not
    # per row tile: the op then runs whole. A layer's weights are 2-D [N, K] and never qualify.
    if any(_is_weight_like(v) and len(shape := tensor_info(v.type).shape) >= 3 and shape[1] == rows > 1
           for v in values):
        return False
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


@dataclass(frozen=True)
class FlashParts:
    """What flash attention cuts in a group: the attention, the concats it computes per key block, and
    the external values loaded per key block with the attention operand whose slots they fill (1 keys,
    2 values, 3 mask)."""

    att: Operation
    fused: tuple[Operation, ...]
    sources: dict[SSAValue, int]


def _int_attr(op: Operation, name: str) -> int:
    return op.attributes[name].value.data  # type: ignore[attr-defined]


def concat_target(op: Operation, users: dict[SSAValue, list[Operation]]) -> Operation | None:
    """The attention a Concat along tokens feeds as its keys or values and nothing else (so the concat
    can be computed one key block at a time, never whole), or None."""
    if op.name != "tpu.Concat" or _int_attr(op, "axis") != 1:
        return None
    readers = users.get(op.results[0], [])
    if len(readers) != 1 or readers[0].name != "tpu.FAttention":
        return None
    att = readers[0]
    uses = [i for i, v in enumerate(att.operands) if v is op.results[0]]
    return att if uses and all(i in (1, 2) for i in uses) else None


def flash_parts(net: NetInfo, ops: Sequence[Operation], inside: set[SSAValue]) -> FlashParts | None:
    """The group's one attention cut into key blocks, or None if the group cannot be: K and V must be
    external values or concats of them (or of rows computed in the group) that only the attention reads;
    the mask must be external."""
    atts = [op for op in ops if op.name == "tpu.FAttention"]
    if len(atts) != 1 or atts[0].operands[3] in inside:
        return None
    att = atts[0]
    members = set(ops)
    fused: list[Operation] = []
    sources: dict[SSAValue, int] = {}
    for i in (1, 2):
        src = att.operands[i]
        owner = src.owner
        if isinstance(owner, Operation) and owner in members and concat_target(owner, net.users) is att:
            fused.append(owner)
            sources.update({x: i for x in owner.operands if x not in inside})
        elif src not in inside:
            sources[src] = i
        else:
            return None
    sources[att.operands[3]] = 3
    return FlashParts(att, tuple(fused), sources)


def layout(net: NetInfo, index: int, ops: list[Operation], tile_rows: int, stream: bool,
           kvh_tile: int, key_block: int = 0) -> GroupPlan | None:
    """Place every buffer of the group in local memory; None if it does not fit. `key_block` > 0: the
    group's attention as flash attention with blocks of that many keys (and row tiles of queries)."""
    a = net.align
    inside = {r for op in ops for r in op.results}
    in_group = set(ops)
    flash = flash_parts(net, ops, inside) if key_block else None
    if key_block and flash is None:
        return None
    fused = set(flash.fused) if flash else set()
    # Row tiles of a group with flash attention: every other op must be row-local (the caller checks
    # groups without attention).
    if tile_rows and flash and any(not (op is flash.att or op in fused or row_local(op, net.rows)) for op in ops):
        return None
    loads: dict[SSAValue, str] = {}
    tile_n: dict[Operation, int] = {}
    tile_kvh: dict[Operation, int] = {}
    stream_parts: dict[tuple, int] = {}  # ("stream", op, operand) -> offset inside a slot
    slot = 0
    for op in ops:
        if op.name == "tpu.Reshape" or op in fused:
            continue
        if op.name == "tpu.FAttention" and kvh_tile < _int_attr(op, "kv_head"):
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
            if v in inside or i in sliced or i in dma_tables(op) or (flash and op is flash.att and i > 0):
                continue
            tiled = tile_rows and not _is_weight_like(v) and tensor_info(v.type).shape[1:2] == (net.rows,)
            loads.setdefault(v, "tile" if tiled else "held")
    if flash:
        loads.update({v: "block" for v in flash.sources})
    stores = [r for op in ops for r in op.results
              if any(u not in in_group for u in net.users.get(r, []))]
    if _store_over_later_load(loads, stores, tile_rows):
        return None

    # Pinned for the whole group: held loads, ping-pong row tiles in and out, the two stream slots, the
    # two slots of each key-block operand of flash attention.
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
        if mode != "block":
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
    if flash:
        for i in (1, 2, 3):
            pin(("block", flash.att, i), key_block_bytes(flash.att, i, key_block, tile_rows), 2)
        for v, i in flash.sources.items():
            lmem[("load", v)] = lmem[("block", flash.att, i)]
        for c in flash.fused:
            i = next(n for n, x in enumerate(flash.att.operands) if x is c.results[0])
            lmem[("value", c.results[0])] = lmem[("block", flash.att, i)]

    # The rest by liveness inside the group (a tile's intermediates are reused by the next tile).
    base = top
    intervals: list[tuple[tuple, int, int, int]] = []  # key, size, first, last
    owner: dict[SSAValue, SSAValue] = {}  # reshape results share their operand's buffer
    first: dict[SSAValue, int] = {}
    last: dict[SSAValue, int] = {}
    size: dict[SSAValue, int] = {}
    at = ops.index(flash.att) if flash else -1
    for k, op in enumerate(ops):
        reader = at if op in fused else k  # a fused concat reads its operands while the attention runs
        for v in op.operands:
            if v in inside:
                root = owner.get(v, v)
                last[root] = max(last.get(root, reader), reader)
        if op.name == "tpu.Reshape" and op.operands[0] in inside:
            root = owner.get(op.operands[0], op.operands[0])
            owner[op.results[0]] = root
            if op.results[0] in stored:
                last[root] = max(last.get(root, k), k)
            continue
        if op in fused:
            continue  # its blocks live in the attention's key-block slots
        if op.name == "tpu.FAttention":
            rows = (tile_rows or None) if flash else None
            intervals.append((("scratch", op), attention_scratch(op, tile_kvh.get(op), rows, key_block or None),
                              k, k))
            if flash:
                intervals.append((("state", op), flash_state_bytes(op, tile_rows), k, k))
        r = op.results[0]
        if tile_rows and r in stored:
            continue  # pinned above
        first[r], last[r] = k, max(last.get(r, k), k)
        size[r] = value_bytes(r, tile_rows or None)
    for r, f in first.items():
        intervals.append((("value", r), size[r], f, last[r]))
    peak = _first_fit(intervals, a, lmem, base)
    if peak > net.lmem_bytes:
        return None
    for v, root in owner.items():
        lmem[("value", v)] = lmem[("value", root)]
    # A streamed op with a single slice still streams: its load overlaps the previous op's compute.
    plan = GroupPlan(index, list(ops), net.rows, tile_rows, tile_n, tile_kvh, loads, stores, lmem, slot, peak)
    if flash:
        plan.tile_k[flash.att] = key_block
        plan.fused = list(flash.fused)
        plan.blocks = dict(flash.sources)
    return plan


def _global_span(v: SSAValue) -> tuple[int, int, int] | None:
    """(first byte, end, bytes per row along axis 1) of a value's global home, if it has one."""
    info = tensor_info(v.type)
    if info.address is None:
        return None
    size = nbytes(info.shape, info.dtype)
    rows = info.shape[1] if len(info.shape) > 1 and info.shape[0] == 1 else 1
    return info.address, info.address + size, size // max(rows, 1)


def _store_over_later_load(loads: dict[SSAValue, str], stores: list[SSAValue], tile_rows: int) -> bool:
    """Whether a store of the group may land on global bytes the group loads later. Global addresses are
    planned for the op list, where a value is dead after its last reader, so a later op's result may
    reuse its bytes; a group that loads the value per row tile still reads it after that later op stored
    its first tiles. Row tile t + 1 loads before tile t stores (codegen/groups.py), so a store in tile t
    only harms loads of tiles t + 2 and later; a value loaded per key block is read at every row tile, so
    any overlap harms it. Held loads come before any store of an op they outlive: the op list's liveness
    protects them."""
    for v, mode in loads.items():
        src = _global_span(v) if mode in ("tile", "block") else None
        if src is None:
            continue
        for s in stores:
            out = _global_span(s)
            if out is None or not (src[0] < out[1] and out[0] < src[1]):
                continue
            if mode == "block" or not tile_rows:
                return True
            lo, hi = max(src[0], out[0]), min(src[1], out[1])  # the shared bytes, as rows of each
            first_store_tile = (lo - out[0]) // out[2] // tile_rows
            last_load_tile = (hi - 1 - src[0]) // src[2] // tile_rows
            if last_load_tile >= first_store_tile + 2:
                return True
    return False


def _alias_of_inside(v: SSAValue, inside: set[SSAValue]) -> bool:
    owner = v.owner
    return isinstance(owner, Operation) and owner.name == "tpu.Reshape" and owner.operands[0] in inside


def attention_scratch(op: Operation, kvh_tile: int | None, rows: int | None = None,
                      keys: int | None = None) -> int:
    """Scores and probabilities of one block of heads, f32: what flash attention keeps in local memory
    while one command runs (`rows` query rows by `keys` keys; default every row and every key)."""
    q = tensor_info(op.operands[0].type).shape
    kvh = _int_attr(op, "kv_head")
    heads = q[2] // kvh * (kvh_tile or kvh)
    return 2 * 4 * heads * (rows or q[1]) * (keys or _int_attr(op, "mk"))


def flash_state_bytes(op: Operation, tile_rows: int) -> int:
    """The online softmax's state of every head for one block of query rows: accumulator, max and sum."""
    q = tensor_info(op.operands[0].type).shape
    return STATE_BYTES * q[2] * (tile_rows or q[1]) * (q[3] + 2)


def key_block_bytes(att: Operation, operand: int, key_block: int, tile_rows: int) -> int:
    """One slot of flash attention's operand 1 (a key block, every KV head), 2 (values) or 3 (the mask
    tile: the block's keys for the row tile's queries)."""
    info = tensor_info(att.operands[operand].type)
    if operand == 3:
        return nbytes((*info.shape[:2], tile_rows or info.shape[2], key_block), info.dtype)
    return nbytes((info.shape[0], key_block, *info.shape[2:]), info.dtype)


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
    """Row tiles to try, largest first: two tiles at least when the rows allow (so loads overlap), and
    MAX_ROW_TILE at most."""
    if rows < 2 * ROW_BLOCK:
        return [rows]
    t = min(rows // 2 // ROW_BLOCK * ROW_BLOCK, MAX_ROW_TILE)
    out = []
    while t >= ROW_BLOCK:
        out.append(t)
        t = t // 2 // ROW_BLOCK * ROW_BLOCK
    return out


def _kvh_options(ops: Iterable[Operation]) -> list[int]:
    heads = [_int_attr(op, "kv_head") for op in ops if op.name == "tpu.FAttention"]
    if not heads:
        return [1]
    kvh = max(heads)
    return [d for d in range(kvh, 0, -1) if kvh % d == 0]


def _key_options(keys: int) -> list[int]:
    """Key blocks to try, largest first: every key, then powers of two down to KEY_BLOCK_FLOOR."""
    out = [keys]
    b = 1 << (keys - 1).bit_length() - 1 if keys > 1 else 1
    while b >= KEY_BLOCK_FLOOR:
        if b < keys:
            out.append(b)
        b //= 2
    return out


def plan_group(net: NetInfo, index: int, ops: list[Operation]) -> GroupPlan | None:
    """The first tiling, in order of preference, under which the group fits: attention whole (or in
    blocks of KV heads), then as flash attention."""
    tiled = net.prefill and net.rows > 1 and all(row_local(op, net.rows) for op in ops)
    tiles = _tile_options(net.rows) if tiled else [0]
    streams = (True,) if not net.prefill else (False, True)
    atts = [op for op in ops if op.name == "tpu.FAttention"]
    # Scores of a single KV head's queries that exceed local memory rule attention out whole.
    if all(attention_scratch(op, 1) <= net.lmem_bytes for op in atts):
        for stream in streams:
            for t in tiles:
                for kvh in _kvh_options(ops):
                    plan = layout(net, index, ops, t if t < net.rows else 0, stream, kvh)
                    if plan is not None:
                        return plan
    if len(ops) == 1 and head_axes(ops[0]) is not None:
        return head_layout(net, index, ops[0])
    return flash_layout(net, index, ops, streams) if len(atts) == 1 else None


def head_axes(op: Operation) -> tuple[tuple[int, ...], int] | None:
    """(each operand's axis of heads, the result's) of an op the planner may compute alone in blocks of
    heads (or of channels), or None: the gated delta rule (q, k, v, g, beta on axis 2, the state's heads on
    axis 1), the data movement that takes its result apart (a Slice of [1, rows, heads, dim] along another
    axis, the Permute that brings the heads first), and the convolution that feeds it. Each computes a
    head (a channel) from that head's values alone, so a block gives the bits of the whole."""
    if op.name == "tpu.GatedDeltaRule":
        return (2, 2, 2, 2, 2, 1)[: len(op.operands)], 2
    rank = len(tensor_info(op.operands[0].type).shape)
    # What feeds it, channel by channel ([1, tokens, channels]): the depthwise causal convolution (its
    # weight's channels on axis 0) and the concat of the carried window and the new rows.
    if op.name == "tpu.CausalConv1d":
        return (2, 0), 2
    if (op.name == "tpu.Concat" and rank == 3 and _int_attr(op, "axis") == 1
            and all(len(tensor_info(x.type).shape) == 3 for x in op.operands)):
        return (2,) * len(op.operands), 2
    order = tuple(op.attributes["order"].get_values()) if op.name == "tpu.Permute" else ()  # type: ignore[attr-defined]
    # A vision tower's patches from a convolution's channels-first result ([1, channels, patches] to [1,
    # patches, channels]): each block of patches moves alone. A 4096-patch piece of 1152 channels is 18 MiB.
    if rank == 3 and order == (0, 2, 1):
        return (2,), 1
    if rank != 4:
        return None
    if op.name == "tpu.Slice" and _int_attr(op, "axis") != 2:
        return (2,), 2
    if order == (0, 2, 1, 3):
        return (2,), 1
    return None


def head_layout(net: NetInfo, index: int, op: Operation) -> GroupPlan | None:
    """`op` alone (head_axes) in blocks of heads, the most heads that fit (operands and result in two slots
    each, loaded and stored per block), or None if one head does not fit. A delta rule's blocks keep
    whole key heads or lie inside one key head's group (block_sizes)."""
    axes = head_axes(op)
    if axes is None:
        return None
    a = net.align
    result = op.results[0]
    out = _global_span(result)
    # Block b's store lands before block b + 1 loads: the result must not share global bytes with an operand.
    if out is not None and any((src := _global_span(x)) is not None and src[0] < out[1] and out[0] < src[1]
                               for x in op.operands):
        return None
    heads = tensor_info(op.operands[0].type).shape[axes[0][0]]
    delta = op.name == "tpu.GatedDeltaRule"
    key_heads = heads
    if delta:
        heads = tensor_info(op.operands[2].type).shape[2]
    sizes = block_sizes(heads, key_heads) if delta else [m for m in range(heads, 0, -1) if heads % m == 0]
    for m in sizes[1:]:  # whole (m = heads) was tried by the caller
        lmem: dict[tuple, tuple[int, ...]] = {}
        top = 0
        parts = [(("load", x), x, axes[0][i], head_block(heads, key_heads, 0, m)[1] if delta and i < 2 else m)
                 for i, x in enumerate(op.operands)]
        for key, v, axis, count in [*parts, (("value", result), result, axes[1], m)]:
            info = tensor_info(v.type)
            shape = list(info.shape)
            shape[axis] = count
            size = _align(nbytes(shape, info.dtype), a)
            lmem[key] = (top, top + size)
            top += 2 * size
        if top <= net.lmem_bytes:
            loads = {x: "head" for x in op.operands}
            plan = GroupPlan(index, [op], net.rows, 0, {}, {}, loads, [result], lmem, 0, top)
            plan.tile_vh[op] = m
            return plan
    return None


def flash_layout(net: NetInfo, index: int, ops: list[Operation], streams: Sequence[bool]) -> GroupPlan | None:
    """The group with its attention as flash attention, if it fits: the largest query-row tile first
    (every re-read of K and V is one more row tile), then the most KV heads per command, then the largest
    key block (at least KEY_BLOCK_MIN keys unless nothing else fits)."""
    att = next(op for op in ops if op.name == "tpu.FAttention")
    mq = _int_attr(att, "mq")
    rows = [0]
    if net.prefill and net.rows > 1 and mq == net.rows:
        rows += [t for t in _tile_options(net.rows) if t < net.rows]
    keys = _key_options(_int_attr(att, "mk"))
    preferred = [k for k in keys if k >= min(keys[0], KEY_BLOCK_MIN)]
    heads = _kvh_options([att])
    for stream in streams:
        if layout(net, index, ops, rows[-1], stream, heads[-1], keys[-1]) is None:
            continue  # not even the smallest blocks fit

        for options in (preferred, keys):
            for tq in rows:
                for kvh in heads:
                    def fit(tk: int, tq: int = tq, kvh: int = kvh, stream: bool = stream) -> GroupPlan | None:
                        return layout(net, index, ops, tq, stream, kvh, tk)

                    if fit(options[-1]) is None:
                        continue
                    return _largest(fit, options)
    return None


def _largest(fit: Callable[[int], GroupPlan | None], options: list[int]) -> GroupPlan:
    """The plan of the first (largest) option that fits; options[-1] is known to fit, and the memory a
    plan needs grows with the option, so a binary search finds the boundary."""
    lo, hi = 0, len(options) - 1  # options[hi] fits
    best = fit(options[hi])
    assert best is not None
    while lo < hi:
        mid = (lo + hi) // 2
        plan = fit(options[mid])
        if plan is not None:
            hi, best = mid, plan
        else:
            lo = mid + 1
    return best


def _units(compute: list[Operation], users: dict[SSAValue, list[Operation]]) -> list[list[Operation]]:
    """The ops in order, as units the greedy pass places together: a run of concats that only an
    attention reads, with that attention (the concats alone may not fit, computed per key block they
    always do), and every other op on its own."""
    units: list[list[Operation]] = []
    position = {op: i for i, op in enumerate(compute)}
    i = 0
    while i < len(compute):
        att = concat_target(compute[i], users)
        if att is not None and att in position:
            run = compute[i : position[att] + 1]
            if all(op is att or concat_target(op, users) is att for op in run):
                units.append(run)
                i += len(run)
                continue
        units.append([compute[i]])
        i += 1
    return units


def plan_groups(fn: func.FuncOp, lmem_bytes: int, align: int, lanes: int, prefill: bool, rows: int,
                net_name: str, other_rows: Sequence[int] = ()) -> list[GroupPlan]:
    """Greedy: extend the current group while it fits; close it when the next op does not fit or, in
    prefill, when the next op changes between row-tiled and not, or would make the group stream weights
    it held until then. `other_rows`: token counts besides `rows` that ops of the net work on (a vision
    tower whose merger quarters its rows midway): such an op is row-tiled over its own count, in groups
    of ops of that count."""
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
    others = {r: replace(net, rows=r) for r in other_rows if r > 1 and r != rows} if prefill else {}

    def net_for(unit: list[Operation]) -> NetInfo:
        """The net as the unit's ops see it: over the token count they work on, where they do not fit
        whole otherwise (a net that fits plans as it did with one count)."""
        for r, other in others.items():
            if all(row_local(op, r) or (op.name == "tpu.FAttention" and _int_attr(op, "mq") == r) for op in unit):
                return net if plan_group(net, len(groups), list(unit)) is not None else other
        return net

    groups: list[GroupPlan] = []
    current: list[Operation] = []
    plan: GroupPlan | None = None
    produced: set[SSAValue] = set()  # values the current group computes
    group_net = net

    def close() -> None:
        nonlocal current, plan
        if current:
            assert plan is not None
            groups.append(plan)
        current, plan = [], None
        produced.clear()  # a closed group's values are in global memory: a Reshape of one is a view there

    for unit in _units(compute, users):
        op = unit[0]
        if op.name == "tpu.Reshape" and op.operands[0] not in produced:
            continue  # a view of a value in global memory: no work, no group
        if op.name == "tpu.Reshape" and current:
            current.append(op)
            produced.add(op.results[0])
            plan = plan_group(group_net, len(groups), current) or plan
            continue
        unit_net = net_for(unit)
        if current and (unit_net is not group_net or (
                prefill and row_local(op, unit_net.rows) != row_local(current[-1], unit_net.rows))):
            close()
        if not current:
            group_net = unit_net
        candidate = plan_group(group_net, len(groups), [*current, *unit]) if current else None
        if candidate is not None and prefill and candidate.tile_n and plan is not None and not plan.tile_n:
            candidate = None  # prefill holds weights: a new group beats loading them again per row tile
        if candidate is None:
            close()
            group_net = unit_net
            candidate = plan_group(group_net, len(groups), list(unit))
            if candidate is None:
                raise LlmbuildError(
                    f"{net_name}: {unit[-1].attributes['loc'].data}: does not fit local memory "  # type: ignore[attr-defined]
                    f"({lmem_bytes} bytes) under any tiling the layer-group pass knows"
                )
        current.extend(unit)
        produced.update(r for u in unit for r in u.results)
        plan = candidate
    close()
    for i, g in enumerate(groups):
        g.index = i
    return groups

"""Code generation for layer groups: each `tpu.Group` becomes commands in issue order.

The IR says what each group holds and where (`ginfo`); this file decides the order in which the DMA and
compute commands are issued, i.e. the software pipeline:
- a held operand (a weight used by every row tile) is loaded while the op before its first reader
  computes (one op ahead);
- row tile r+1's inputs are loaded before tile r computes, into the other copy of each ping-pong pair;
  a tile's results are stored right after the op that makes them (the store of tile r overlaps tile r+1);
- streamed weight slices pass through two slots: slice k+1 (of this op or the next streamed op, also
  across row tiles) is loaded before slice k computes.

Every command touches tensors of the program's table. Local tensors (buffer >= 0) are allocations in
local memory; each load or result makes a new allocation (so the simulator can tell live data from
dead), and a Reshape inside a group is a view that shares its operand's allocation.

- flash attention (an attention with `tile_k`): for each row tile of queries, each key block's K, V and
  mask tile are loaded into the other slot of their pair before the previous block computes (block loads
  run one ahead, across row tiles too); a Concat of the history and the new rows is computed per key
  block, its inputs' rows loaded side by side into the block's slot (views of one allocation, so it copies
  only rows computed in the group); each block updates the running state once per block of KV heads, and
  the last block's `end` commands write the output rows.

Compute commands carry the op's attributes plus where their piece goes:
    g_row  first row (token, axis 1) of this piece in the whole result: a row tile, or a key block of a
           concat computed per block
    g_out  [axis, start, length]: the command writes that slice of its result tensor (a streamed N slice,
           a block of attention heads); absent: the whole result tensor
    g_in   [operand, axis, start, length, ...]: slices of local operands the command reads
    g_piece [axis, start, length]: the command's whole result is that slice of the op's result (a block of
           heads of an op whose operands were loaded per block of heads: a gated delta rule, a Slice or
           Permute of its result)
    scratch [lmem address, bytes]: attention's scores and probabilities
    g_flash "block": one key block of flash attention (operands q, k, v, mask and, after the first
           block, the running state; result: the state, f32 [B, kvh, group, rows, dim + 2] in local
           memory); "end": the output rows from the state
Loads and stores carry `axis` and `start` (-1: the whole tensor), or lists of both for a slice along several
axes (a mask tile: its rows and a key block's columns).
Every command issued for row tile t > 0 of a row-tiled group carries `g_tile` = t (its loads too, though
they are issued during tile t - 1): a simulator checking a few real tokens of a long prefill runs the tiles
that hold them and skips the rest (runtime/local_memory.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute, Operation, SSAValue

from llmbuild import LlmbuildError
from llmbuild.binary.program import Group, Instr, Program, TensorDesc
from llmbuild.dialects import tpu
from llmbuild.dialects.plain import TensorInfo, main_func, tensor_info
from llmbuild.dialects.tpu import GroupInfo
from llmbuild.numerics.formats import itemsize
from llmbuild.op_defs.gated_delta_rule import head_block

# tensor_info and ginfo of the module being unrolled, by object identity (the objects are kept, so the ids
# stay theirs): a long attention's blocks ask for the same few types thousands of times.
_MEMO: dict[int, tuple[Any, Any]] = {}


def _info(t: Attribute) -> TensorInfo:
    hit = _MEMO.get(id(t))
    if hit is None or hit[0] is not t:
        hit = _MEMO[id(t)] = (t, tensor_info(t))
    return hit[1]


def add_groups(prog: Program, grouped: ModuleOp) -> None:
    """Append the command stream of every tpu.Group of `grouped` to `prog` (made from the same net)."""
    index = {t: i for i, t in reversed(list(enumerate(prog.tensors)))}
    by_loc = {ins.loc: ins for ins in prog.instrs}
    counter = [0]
    try:
        for op in main_func(grouped).body.block.ops:
            if isinstance(op, tpu.GroupOp):
                prog.groups.append(_Unroller(prog, index, by_loc, op, counter).run())
    finally:
        _MEMO.clear()


def _loc(v: SSAValue) -> str:
    owner = v.owner
    if isinstance(owner, tpu.GroupOp):
        stored = owner.body.block.last_op.operands[v.index]  # type: ignore[union-attr]
        return _loc(stored.owner.operands[0])  # type: ignore[union-attr]
    if isinstance(owner, Operation) and "loc" in owner.attributes:
        return owner.attributes["loc"].data  # type: ignore[attr-defined]
    return "input"


def _ginfo(op: Operation) -> GroupInfo:
    hit = _MEMO.get(id(op))
    if hit is None or hit[0] is not op:
        hit = _MEMO[id(op)] = (op, GroupInfo.of(op.attributes["ginfo"]))
    return hit[1]


def _int(op: Operation, key: str) -> int:
    return int(op.attributes[key].value.data)  # type: ignore[attr-defined]


class _Unroller:
    def __init__(self, prog: Program, index: dict[TensorDesc, int], by_loc: dict[str, Instr],
                 group: tpu.GroupOp, counter: list[int]):
        self.prog, self.index, self.by_loc, self.counter = prog, index, by_loc, counter
        self.g = Group(_int(group, "group"), _int(group, "rows"), _int(group, "tile_rows"),
                       _int(group, "lmem_peak_bytes"))
        self.compute: list[Operation] = []
        self.held: dict[SSAValue, Operation] = {}
        self.tile: dict[SSAValue, Operation] = {}
        self.stream: dict[Operation, list[tuple[int, Operation]]] = {}
        self.stores: dict[SSAValue, Operation] = {}
        self.block: dict[SSAValue, Operation] = {}  # loaded per key block of flash attention
        self.heads: dict[SSAValue, Operation] = {}  # loaded per block of heads (a gated delta rule's)
        self.fused: set[Operation] = set()  # concats computed per key block
        for op in group.body.block.ops:
            if isinstance(op, tpu.LoadOp):
                mode = _ginfo(op).mode
                if mode == "stream":
                    use = next(iter(op.results[0].uses))
                    self.stream.setdefault(use.operation, []).append((use.index, op))
                elif mode == "block":
                    self.block[op.results[0]] = op
                elif mode == "head":
                    self.heads[op.results[0]] = op
                else:
                    (self.held if mode == "held" else self.tile)[op.results[0]] = op
            elif isinstance(op, tpu.StoreOp):
                self.stores[op.operands[0]] = op
            elif not isinstance(op, tpu.YieldOp):
                self.compute.append(op)
                if _ginfo(op).mode == "block":
                    self.fused.add(op)
        self.flash: _Flash | None = None
        self.head_block = _int(group, "head_block") if "head_block" in group.attributes else 0
        self.tile_index = 0  # the row tile whose compute commands are being issued

    # ---- tensors --------------------------------------------------------------------------------

    def global_id(self, v: SSAValue) -> int:
        info = _info(v.type)
        if info.address is None:
            raise LlmbuildError(f"{self.prog.net}: group {self.g.index}: a global tensor without an address")
        desc = TensorDesc(info.dtype, info.shape, info.address)
        if desc not in self.index:
            self.index[desc] = len(self.prog.tensors)
            self.prog.tensors.append(desc)
        return self.index[desc]

    def local(self, dtype: str, shape: tuple[int, ...], address: int, buffer: int | None = None) -> int:
        if buffer is None:
            buffer = self.counter[0]
            self.counter[0] += 1
        self.prog.tensors.append(TensorDesc(dtype, shape, address, buffer))
        return len(self.prog.tensors) - 1

    def tile_shape(self, v: SSAValue, rows: int | None) -> tuple[int, ...]:
        shape = list(_info(v.type).shape)
        if rows is not None:
            shape[1] = rows
        return tuple(shape)

    # ---- commands -------------------------------------------------------------------------------

    def load(self, load: Operation, address: int, axis: int | list[int], start: int | list[int],
             shape: tuple[int, ...], buffer: int | None = None, tile: int = 0) -> int:
        src = load.operands[0]
        dst = self.local(_info(src.type).dtype, shape, address, buffer)
        attrs: dict[str, Any] = {"axis": axis, "start": start}
        if tile:
            attrs["g_tile"] = tile
        self.g.cmds.append(Instr("Load", (self.global_id(src),), dst, _loc(src), attrs))
        return dst

    def run(self) -> Group:
        if self.heads:
            return self._run_heads()
        T, rows = self.g.tile_rows, self.g.rows
        tiles = [(r, min(T, rows - r)) for r in range(0, rows, T)] if T else [(0, None)]
        flash = [op for op in self.compute if "tile_k" in self._attrs(op)]
        if flash:
            self.flash = _Flash(self, flash[0], tiles)
        queue = [(op, j) for _ in tiles for op in self.compute if op in self.stream
                 for j in range(self._slices(op))]
        per_tile = max(1, len(queue) // len(tiles))  # the stream repeats each row tile's slices in order
        held: dict[SSAValue, int] = {}
        tile_locals: dict[int, dict[SSAValue, int]] = {}
        stream_locals: dict[int, dict[int, int]] = {}
        loaded, k = 0, 0

        def load_tile(t: int) -> None:
            start, n = tiles[t]
            tile_locals[t] = {
                v: self.load(ld, _ginfo(ld).lmem[t % 2], 1, start, self.tile_shape(v, n), tile=t)
                for v, ld in self.tile.items()
            }

        def load_held(i: int) -> None:
            if i >= len(self.compute):
                return
            for v in self.compute[i].operands:
                if v in self.held and v not in held:
                    held[v] = self.load(self.held[v], _ginfo(self.held[v]).lmem[0], -1, 0,
                                        _info(v.type).shape)

        def load_stream(upto: int) -> None:
            nonlocal loaded
            while loaded <= min(upto, len(queue) - 1):
                op, j = queue[loaded]
                tn = self._tile_n(op)
                n = _info(op.operands[1].type).shape[0]
                count = min(tn, n - j * tn)
                stream_locals[loaded] = {
                    i: self.load(ld, _ginfo(ld).lmem[loaded % 2], 0, j * tn,
                                 (count, *_info(ld.operands[0].type).shape[1:]), tile=loaded // per_tile)
                    for i, ld in self.stream[op]
                }
                loaded += 1

        for t, (start, n) in enumerate(tiles):
            self.tile_index = t
            if t == 0:
                load_tile(0)
            if t + 1 < len(tiles):
                load_tile(t + 1)
            cur: dict[SSAValue, int] = {}

            def operand(v: SSAValue, _t: int = t, _cur: dict = cur) -> int:
                if v in _cur:
                    return _cur[v]
                if v in held:
                    return held[v]
                if v in tile_locals.get(_t, {}):
                    return tile_locals[_t][v]
                if isinstance(v.owner, tpu.LoadOp):
                    raise LlmbuildError(f"{self.prog.net}: group {self.g.index}: operand loaded out of order")
                return self.global_id(v)  # a DMA gather's table

            for i, op in enumerate(self.compute):
                if t == 0:
                    load_held(i)
                    load_stream(0)
                    load_held(i + 1)
                if op in self.fused:
                    continue  # computed per key block by the attention that reads it
                r = op.results[0]
                info = _ginfo(op)
                shape = self.tile_shape(r, n)
                if op.name == "tpu.Reshape":
                    src = self.prog.tensors[cur[op.operands[0]]]
                    cur[r] = self.local(src.dtype, shape, src.address, src.buffer)
                else:
                    address = info.lmem[t % len(info.lmem)]
                    out = cur[r] = self.local(_info(r.type).dtype, shape, address)
                    attrs = dict(self.by_loc[op.attributes["loc"].data].attrs)  # type: ignore[attr-defined]
                    if T:
                        attrs["g_row"] = start
                    if info.scratch is not None:
                        attrs["scratch"] = list(info.scratch)
                    k = self._issue(op, t, out, attrs, operand, k, stream_locals, load_stream)
                if r in self.stores:
                    store = self.stores[r]
                    tiled = _ginfo(store).mode == "tile"
                    where = {"axis": 1 if tiled else -1, "start": start if tiled else 0}
                    if t:
                        where["g_tile"] = t
                    self.g.cmds.append(Instr("Store", (cur[r],), self.global_id(store.results[0]), _loc(r), where))
        return self.g

    def _run_heads(self) -> Group:
        """One op in blocks of `head_block` heads (a gated delta rule, or a Slice or Permute of its result):
        block b + 1's operands load into the other slot of each pair before block b computes, and block b's
        result is stored right after it, along the heads' axis of the result."""
        (op,) = self.compute
        attrs = {k: v for k, v in self._attrs(op).items() if k != "tile_vh"}
        m = self.head_block
        delta = op.name == "tpu.GatedDeltaRule"
        first = next(iter(self.heads.values()))
        heads = _info(op.operands[2 if delta else 0].type).shape[2 if delta else _ginfo(first).axis]  # type: ignore[index]
        key_heads = _info(op.operands[0].type).shape[2]
        blocks = [(h, min(m, heads - h)) for h in range(0, heads, m)]
        locals_: dict[int, list[int]] = {}

        def load_block(b: int) -> None:
            h, c = blocks[b]
            args = []
            for i, v in enumerate(op.operands):
                ld = self.heads[v]
                start, count = head_block(heads, key_heads, h, c) if delta and i < 2 else (h, c)
                axis = _ginfo(ld).axis
                assert axis is not None
                shape = list(_info(v.type).shape)
                shape[axis] = count
                args.append(self.load(ld, _ginfo(ld).lmem[b % 2], axis, start, tuple(shape)))
            locals_[b] = args

        r = op.results[0]
        store = self.stores[r]
        axis = _ginfo(store).axis
        assert axis is not None
        load_block(0)
        for b, (h, c) in enumerate(blocks):
            if b + 1 < len(blocks):
                load_block(b + 1)
            shape = list(_info(r.type).shape)
            shape[axis] = c
            out = self.local(_info(r.type).dtype, tuple(shape), _ginfo(op).lmem[b % 2])
            self._cmd(op, locals_.pop(b), out, {**attrs, "g_piece": [axis, h, c]})
            where = {"axis": axis, "start": h}
            self.g.cmds.append(Instr("Store", (out,), self.global_id(store.results[0]), _loc(r), where))
        return self.g

    def _issue(self, op: Operation, t: int, out: int, attrs: dict[str, Any], operand: Callable[[SSAValue], int],
               k: int, stream_locals: dict[int, dict[int, int]], load_stream: Any) -> int:
        """The commands of one op in row tile t (k: the next weight slice of the group's stream)."""
        if self.flash is not None and op is self.flash.att:
            # K, V and the mask come block by block; only the queries are whole (or a row tile)
            self.flash.run(t, operand(op.operands[0]), out, attrs, operand)
            return k
        streamed = {i for i, _ in self.stream.get(op, [])}
        args = [-1 if n in streamed else operand(v) for n, v in enumerate(op.operands)]
        if op in self.stream:
            return self._streamed(op, args, out, attrs, k, stream_locals, load_stream)
        if "tile_kvh" in attrs:
            self._attention_blocks(op, args, out, attrs)
        else:
            self._cmd(op, args, out, attrs)
        return k

    def _cmd(self, op: Operation, args: list[int], out: int, attrs: dict[str, Any]) -> None:
        loc = op.attributes["loc"].data  # type: ignore[attr-defined]
        if self.tile_index:
            attrs = {**attrs, "g_tile": self.tile_index}
        self.g.cmds.append(Instr(op.name.split(".", 1)[1], tuple(args), out, loc, attrs))

    def _attrs(self, op: Operation) -> dict[str, Any]:
        """The op's attributes in the op list (tile attributes included)."""
        if op.name == "tpu.Reshape":
            return {}
        return self.by_loc[op.attributes["loc"].data].attrs  # type: ignore[attr-defined]

    def _tile_n(self, op: Operation) -> int:
        n = _info(op.operands[1].type).shape[0]
        return self.by_loc[op.attributes["loc"].data].attrs.get("tile_n", n)  # type: ignore[attr-defined]

    def _slices(self, op: Operation) -> int:
        n = _info(op.operands[1].type).shape[0]
        return -(-n // self._tile_n(op))

    def _streamed(self, op: Operation, args: list[int], out: int, attrs: dict[str, Any], k: int,
                  stream_locals: dict[int, dict[int, int]], load_stream: Any) -> int:
        tn = self._tile_n(op)
        n = _info(op.operands[1].type).shape[0]
        axis = len(self.prog.tensors[out].shape) - 1
        for j in range(self._slices(op)):
            load_stream(k + 1)
            sliced = list(args)
            for i, local in stream_locals[k].items():
                sliced[i] = local
            count = min(tn, n - j * tn)
            self._cmd(op, sliced, out, {**attrs, "g_out": [axis, j * tn, count]})
            k += 1
        return k

    def _attention_blocks(self, op: Operation, args: list[int], out: int, attrs: dict[str, Any]) -> None:
        kvh, tile = attrs["kv_head"], attrs["tile_kvh"]
        group = attrs["q_head"] // kvh
        d = attrs["dim"]
        for h in range(0, kvh, tile):
            m = min(tile, kvh - h)
            sub = {k: v for k, v in attrs.items() if k != "tile_kvh"}
            sub.update(kv_head=m, q_head=m * group, g_in=[0, 2, h * group, m * group, 1, 2, h, m, 2, 2, h, m],
                       g_out=[2, h * group * d, m * group * d])
            self._cmd(op, args, out, sub)


class _Flash:
    """The commands of one flash attention (an attention with `tile_k`) of a group, block by block."""

    def __init__(self, u: _Unroller, att: Operation, tiles: list[tuple[int, int | None]]):
        self.u, self.att, self.tiles = u, att, tiles
        a = u._attrs(att)
        self.blocks = [(s, min(a["tile_k"], a["mk"] - s)) for s in range(0, a["mk"], a["tile_k"])]
        self.entries = [(t, j) for t in range(len(tiles)) for j in range(len(self.blocks))]
        self.loaded = 0  # block loads are issued for entries < loaded
        self.locals: dict[int, dict[Any, int]] = {}  # entry -> local tensors of that key block
        # each value loaded per key block -> (attention operand it fills, the concat reading it or None,
        # the concat operand it is)
        self.sources: dict[SSAValue, tuple[int, Operation | None, int]] = {}
        self.fused: dict[int, Operation] = {}  # attention operand -> the concat computed per key block
        self.slots: dict[int, list[int]] = {}
        self.spans: dict[Operation, list[tuple[int, int]]] = {}  # concat -> rows each operand supplies
        for i in (1, 2):
            owner = att.operands[i].owner
            if isinstance(owner, Operation) and owner in u.fused:
                self.fused[i] = owner
                self.slots[i] = list(_ginfo(owner).lmem)
        for v, ld in u.block.items():
            use = next(iter(v.uses))
            if use.operation is att:
                self.sources[v] = (use.index, None, 0)
            else:
                i = next(i for i, c in self.fused.items() if c is use.operation)
                self.sources[v] = (i, use.operation, use.index)
            self.slots.setdefault(self.sources[v][0], list(_ginfo(ld).lmem))

    def _offset(self, concat: Operation, p: int) -> tuple[int, int]:
        """Rows [lo, hi) of the concat's result that its operand p supplies."""
        spans = self.spans.get(concat)
        if spans is None:
            spans, lo = [], 0
            for x in concat.operands:
                spans.append((lo, lo + _info(x.type).shape[1]))
                lo = spans[-1][1]
            self.spans[concat] = spans
        return spans[p]

    def _block(self, e: int, i: int) -> int:
        """The local tensor of key block `e` of operand i (1 keys, 2 values), allocated on first use."""
        rec = self.locals.setdefault(e, {})
        if ("full", i) not in rec:
            info = _info(self.att.operands[i].type)
            cnt = self.blocks[self.entries[e][1]][1]
            shape = (info.shape[0], cnt, *info.shape[2:])
            rec[("full", i)] = self.u.local(info.dtype, shape, self.slots[i][e % 2])
        return rec[("full", i)]

    def load_upto(self, upto: int) -> None:
        """Issue the loads of key blocks up to entry `upto` (one ahead: the other slot of each pair)."""
        while self.loaded <= min(upto, len(self.entries) - 1):
            self._load_entry(self.loaded)
            self.loaded += 1

    def _load_entry(self, e: int) -> None:
        u = self.u
        t, j = self.entries[e]
        s, cnt = self.blocks[j]
        start, n = self.tiles[t]
        rec = self.locals.setdefault(e, {})
        for v, (i, concat, p) in self.sources.items():
            ld = u.block[v]
            shape = _info(ld.operands[0].type).shape
            if i == 3:  # the mask tile: this row tile's queries, this block's keys
                rows, r0 = (n, start) if n is not None else (shape[2], 0)
                rec[3] = u.load(ld, self.slots[3][e % 2], [2, 3], [r0, s], (*shape[:2], rows, cnt), tile=t)
            elif concat is None:
                rec[("full", i)] = u.load(ld, self.slots[i][e % 2], 1, s, (shape[0], cnt, *shape[2:]), tile=t)
            else:  # the rows of this concat operand that fall in the block, at their place in the block
                lo, hi = self._offset(concat, p)
                a0, a1 = max(s, lo), min(s + cnt, hi)
                if a0 < a1:
                    full = u.prog.tensors[self._block(e, i)]
                    row = _nbytes(full) // cnt
                    rec[("piece", v)] = u.load(ld, full.address + (a0 - s) * row, 1, a0 - lo,
                                               (shape[0], a1 - a0, *shape[2:]), full.buffer, tile=t)

    def _operand_block(self, e: int, i: int, operand: Callable[[SSAValue], int]) -> int:
        """Key block `e` of operand i: loaded, or computed by its concat from the pieces in its slot and
        the rows computed in the group."""
        concat = self.fused.get(i)
        if concat is None:
            return self.locals[e][("full", i)]
        s, cnt = self.blocks[self.entries[e][1]]
        args: list[int] = []
        g_in: list[int] = []
        for p, x in enumerate(concat.operands):
            lo, hi = self._offset(concat, p)
            a0, a1 = max(s, lo), min(s + cnt, hi)
            if a0 >= a1:
                continue
            if x in self.u.block:
                args.append(self.locals[e][("piece", x)])
            else:  # computed in the group, whole in local memory
                args.append(operand(x))
                if (a0, a1) != (lo, hi):
                    g_in += [len(args) - 1, 1, a0 - lo, a1 - a0]
        attrs = {**self.u._attrs(concat), "g_row": s, **({"g_in": g_in} if g_in else {})}
        full = self._block(e, i)
        self.u._cmd(concat, args, full, attrs)
        return full

    def run(self, t: int, q: int, out: int, attrs: dict[str, Any], operand: Callable[[SSAValue], int]) -> None:
        """Row tile t: every key block updates the state (per block of KV heads), then the output rows."""
        u, a = self.u, attrs
        kvh, d = a["kv_head"], a["dim"]
        group = a["q_head"] // kvh
        tile = a.get("tile_kvh") or kvh
        heads = [(h, min(tile, kvh - h)) for h in range(0, kvh, tile)]
        rows = self.tiles[t][1] or a["mq"]
        info = _ginfo(self.att)
        state = u.local("f32", (a["batch"], kvh, group, rows, d + 2), info.state[0])
        base = {k: v for k, v in attrs.items() if k not in ("scratch", "tile_kvh")}
        nb = len(self.blocks)
        for j in range(nb):
            e = t * nb + j
            self.load_upto(e + 1)
            kb, vb = self._operand_block(e, 1, operand), self._operand_block(e, 2, operand)
            args = [q, kb, vb, self.locals[e][3]] + ([state] if j else [])
            for h, m in heads:
                sub = {**base, "g_flash": "block", "kv_head": m, "q_head": m * group, "scratch": list(info.scratch)}
                if len(heads) > 1:
                    cut = [0, 2, h * group, m * group, 1, 2, h, m, 2, 2, h, m] + ([4, 1, h, m] if j else [])
                    sub.update(g_in=cut, g_out=[1, h, m])
                u._cmd(self.att, args, state, sub)
            del self.locals[e]
        for h, m in heads:
            sub = {**base, "g_flash": "end", "kv_head": m, "q_head": m * group}
            if len(heads) > 1:
                sub.update(g_in=[0, 1, h, m], g_out=[2, h * group * d, m * group * d])
            u._cmd(self.att, [state], out, sub)


def _nbytes(t: TensorDesc) -> int:
    n = itemsize(t.dtype)
    for s in t.shape:
        n *= s
    return n

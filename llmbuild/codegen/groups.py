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

Compute commands carry the op's attributes plus where their piece goes:
    g_row  first row (token) of this row tile in the whole result
    g_out  [axis, start, length]: the command writes that slice of its result tensor (a streamed N slice,
           a block of attention heads); absent: the whole result tensor
    g_in   [operand, axis, start, length, ...]: slices of local operands the command reads
    scratch [lmem address, bytes]: attention's scores and probabilities
"""

from __future__ import annotations

from typing import Any

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from llmbuild import LlmbuildError
from llmbuild.codegen.program import Group, Instr, Program, TensorDesc
from llmbuild.dialects import tpu
from llmbuild.dialects.plain import main_func, plain, tensor_info


def add_groups(prog: Program, grouped: ModuleOp) -> None:
    """Append the command stream of every tpu.Group of `grouped` to `prog` (made from the same net)."""
    index = {t: i for i, t in reversed(list(enumerate(prog.tensors)))}
    by_loc = {ins.loc: ins for ins in prog.instrs}
    counter = [0]
    for op in main_func(grouped).body.block.ops:
        if isinstance(op, tpu.GroupOp):
            prog.groups.append(_Unroller(prog, index, by_loc, op, counter).run())


def _loc(v: SSAValue) -> str:
    owner = v.owner
    if isinstance(owner, tpu.GroupOp):
        stored = owner.body.block.last_op.operands[v.index]  # type: ignore[union-attr]
        return _loc(stored.owner.operands[0])  # type: ignore[union-attr]
    if isinstance(owner, Operation) and "loc" in owner.attributes:
        return owner.attributes["loc"].data  # type: ignore[attr-defined]
    return "input"


def _ginfo(op: Operation) -> dict[str, Any]:
    return {k: plain(v) for k, v in op.attributes["ginfo"].data.items()}  # type: ignore[attr-defined]


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
        for op in group.body.block.ops:
            if isinstance(op, tpu.LoadOp):
                mode = _ginfo(op)["mode"]
                if mode == "stream":
                    use = next(iter(op.results[0].uses))
                    self.stream.setdefault(use.operation, []).append((use.index, op))
                else:
                    (self.held if mode == "held" else self.tile)[op.results[0]] = op
            elif isinstance(op, tpu.StoreOp):
                self.stores[op.operands[0]] = op
            elif not isinstance(op, tpu.YieldOp):
                self.compute.append(op)

    # ---- tensors --------------------------------------------------------------------------------

    def global_id(self, v: SSAValue) -> int:
        info = tensor_info(v.type)
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
        shape = list(tensor_info(v.type).shape)
        if rows is not None:
            shape[1] = rows
        return tuple(shape)

    # ---- commands -------------------------------------------------------------------------------

    def load(self, load: Operation, address: int, axis: int, start: int, shape: tuple[int, ...]) -> int:
        src = load.operands[0]
        dst = self.local(tensor_info(src.type).dtype, shape, address)
        self.g.cmds.append(Instr("Load", (self.global_id(src),), dst, _loc(src), {"axis": axis, "start": start}))
        return dst

    def run(self) -> Group:
        T, rows = self.g.tile_rows, self.g.rows
        tiles = [(r, min(T, rows - r)) for r in range(0, rows, T)] if T else [(0, None)]
        queue = [(op, j) for _ in tiles for op in self.compute if op in self.stream
                 for j in range(self._slices(op))]
        held: dict[SSAValue, int] = {}
        tile_locals: dict[int, dict[SSAValue, int]] = {}
        stream_locals: dict[int, dict[int, int]] = {}
        loaded, k = 0, 0

        def load_tile(t: int) -> None:
            start, n = tiles[t]
            tile_locals[t] = {
                v: self.load(ld, _ginfo(ld)["lmem"][t % 2], 1, start, self.tile_shape(v, n))
                for v, ld in self.tile.items()
            }

        def load_held(i: int) -> None:
            if i >= len(self.compute):
                return
            for v in self.compute[i].operands:
                if v in self.held and v not in held:
                    held[v] = self.load(self.held[v], _ginfo(self.held[v])["lmem"][0], -1, 0,
                                        tensor_info(v.type).shape)

        def load_stream(upto: int) -> None:
            nonlocal loaded
            while loaded <= min(upto, len(queue) - 1):
                op, j = queue[loaded]
                tn = self._tile_n(op)
                n = tensor_info(op.operands[1].type).shape[0]
                count = min(tn, n - j * tn)
                stream_locals[loaded] = {
                    i: self.load(ld, _ginfo(ld)["lmem"][loaded % 2], 0, j * tn,
                                 (count, *tensor_info(ld.operands[0].type).shape[1:]))
                    for i, ld in self.stream[op]
                }
                loaded += 1

        for t, (start, n) in enumerate(tiles):
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
                r = op.results[0]
                info = _ginfo(op)
                shape = self.tile_shape(r, n)
                if op.name == "tpu.Reshape":
                    src = self.prog.tensors[cur[op.operands[0]]]
                    cur[r] = self.local(src.dtype, shape, src.address, src.buffer)
                else:
                    address = info["lmem"][t % len(info["lmem"])]
                    out = cur[r] = self.local(tensor_info(r.type).dtype, shape, address)
                    attrs = dict(self.by_loc[op.attributes["loc"].data].attrs)  # type: ignore[attr-defined]
                    if T:
                        attrs["g_row"] = start
                    if "scratch" in info:
                        attrs["scratch"] = info["scratch"]
                    streamed = {i for i, _ in self.stream.get(op, [])}
                    args = [-1 if n in streamed else operand(v) for n, v in enumerate(op.operands)]
                    if op in self.stream:
                        k = self._streamed(op, args, out, attrs, k, stream_locals, load_stream)
                    elif "tile_kvh" in attrs:
                        self._attention_blocks(op, args, out, attrs)
                    else:
                        self._cmd(op, args, out, attrs)
                if r in self.stores:
                    store = self.stores[r]
                    tiled = _ginfo(store)["mode"] == "tile"
                    self.g.cmds.append(Instr("Store", (cur[r],), self.global_id(store.results[0]), _loc(r),
                                             {"axis": 1 if tiled else -1, "start": start if tiled else 0}))
        return self.g

    def _cmd(self, op: Operation, args: list[int], out: int, attrs: dict[str, Any]) -> None:
        loc = op.attributes["loc"].data  # type: ignore[attr-defined]
        self.g.cmds.append(Instr(op.name.split(".", 1)[1], tuple(args), out, loc, attrs))

    def _tile_n(self, op: Operation) -> int:
        n = tensor_info(op.operands[1].type).shape[0]
        return self.by_loc[op.attributes["loc"].data].attrs.get("tile_n", n)  # type: ignore[attr-defined]

    def _slices(self, op: Operation) -> int:
        n = tensor_info(op.operands[1].type).shape[0]
        return -(-n // self._tile_n(op))

    def _streamed(self, op: Operation, args: list[int], out: int, attrs: dict[str, Any], k: int,
                  stream_locals: dict[int, dict[int, int]], load_stream: Any) -> int:
        tn = self._tile_n(op)
        n = tensor_info(op.operands[1].type).shape[0]
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

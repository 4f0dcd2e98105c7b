"""Time the compiled layer groups of a program: the commands the device runs, on two in-order engines.

`cost/schedule.py` times idealised tiles derived from the model spec; this file times what the
layer-group pass and `codegen/groups.py` actually emitted. The rule, command by command in issue order:

- two engines, each in order: the DMA engine runs Load, Store and the DMA gathers (a Gather or
  A16Gather whose table is in global memory reads its rows by DMA); the compute engine runs the rest
  (the MAC array and the vector unit issue from one stream, so their times add);
- a command starts when its engine is free and its inputs are ready: the last write of every local
  buffer it reads (read after write), and, for a Load, every earlier Store of the same net that wrote
  global bytes it reads;
- a command that first writes a local allocation (a Load, a result, attention's scratch) waits until
  every earlier allocation overlapping those bytes has been read for the last time (write after read):
  this is what makes the ping-pong slots double buffers, and what stops a group's first load from
  overwriting local memory the previous group still reads;
- nets run back to back, each starting when the previous one has finished on both engines (the next
  net's input is the previous net's output); one host launch per step (the `llmbuild` schedule).

So overlap is exactly what the issue order allows: a streamed weight slice loads while the previous
slice computes, row tile r+1 loads while tile r computes, held weights load one op ahead. Nothing moves
across nets, and within a net only as far as the in-order DMA queue allows (the code generator issues a
group's loads after the previous group's stores).

Work per command uses the same rates and efficiencies as the spec model (`hardware.Rates`,
`efficiency.Efficiency`) and the same per-element vector costs (`ops.py`), so the two compare.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from llmbuild.binary.program import Instr, Program, TensorDesc
from llmbuild.cost.efficiency import Efficiency
from llmbuild.cost.hardware import Rates
from llmbuild.cost.ops import ADD_OPS, FLASH_RESCALE_OPS, SOFTMAX_OPS
from llmbuild.cost.weight_formats import DEQUANT_OPS
from llmbuild.numerics.formats import STORAGE
from llmbuild.op_defs import OPS, OpDef
from llmbuild.op_defs.gated_delta_rule import work as delta_rule_work

# How each compute command is timed, from its definition (llmbuild/op_defs/): MAC work, attention's own
# rule, or vector operations per result element (f32 on the vector unit; 0: a view, nothing computed).
# Copies (Concat, Permute, a Gather from a local table) cost one operation per element (a Concat only for
# the rows it moves: a key block's pieces are loaded in place).


@dataclass(frozen=True)
class CostTables:
    mac_ops: tuple[str, ...]
    attention_ops: tuple[str, ...]
    vector_ops: dict[str, int]  # vector operations per result element; 0: a view
    recurrence_ops: tuple[str, ...] = ()  # priced by their own rule (work())


def cost_tables(defs: Iterable[OpDef]) -> CostTables:
    defs = tuple(defs)
    return CostTables(
        mac_ops=tuple(op.name for op in defs if op.cost == "mac"),
        attention_ops=tuple(op.name for op in defs if op.cost == "attention"),
        vector_ops={op.name: op.vector_ops for op in defs if op.cost in ("vector", "view")},
        recurrence_ops=tuple(op.name for op in defs if op.cost == "recurrence"),
    )


_TABLES = cost_tables(OPS)
MAC_OPS = _TABLES.mac_ops
ATTENTION_OPS = _TABLES.attention_ops
RECURRENCE_OPS = _TABLES.recurrence_ops
EU_OPS_PER_ELEMENT = _TABLES.vector_ops
DMA_OPS = ("Load", "Store")
MAC_DTYPES = ("f32", "bf16", "f16")


def nbytes(t: TensorDesc) -> int:
    return STORAGE[t.dtype][0] * math.prod(t.shape)


@dataclass
class GroupTime:
    index: int
    estimated_seconds: float  # from the end of the previous group (or the net's start) to this one's end
    dma_bytes: int
    dma_s: float  # busy time of the DMA engine on this group's commands
    compute_s: float  # busy time of the compute engine
    flops: float
    eu_ops: float
    bytes_by_region: dict[str, int] = field(default_factory=dict)  # global bytes moved, by memory region

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class NetTime:
    name: str
    stage: str
    layer: int
    latency_s: float
    groups: list[GroupTime]

    @property
    def dma_bytes(self) -> int:
        return sum(g.dma_bytes for g in self.groups)

    @property
    def dma_s(self) -> float:
        return sum(g.dma_s for g in self.groups)

    @property
    def compute_s(self) -> float:
        return sum(g.compute_s for g in self.groups)

    def region_bytes(self, *regions: str) -> int:
        return sum(g.bytes_by_region.get(r, 0) for g in self.groups for r in regions)

    def to_dict(self) -> dict:
        return {"name": self.name, "stage": self.stage, "layer": self.layer, "latency_s": self.latency_s,
                "dma_bytes": self.dma_bytes, "dma_s": self.dma_s, "compute_s": self.compute_s,
                "groups": [g.to_dict() for g in self.groups]}


class CommandCost:
    """DMA bytes or compute work of single commands of one program."""

    def __init__(self, prog: Program, rates: Rates, eff: Efficiency):
        self.prog, self.rates, self.eff = prog, rates, eff
        self.dma_rate = rates.ddr_bytes_per_s * eff.ddr

    def is_dma(self, cmd: Instr) -> bool:
        if cmd.op in DMA_OPS:
            return True
        return cmd.op in ("Gather", "A16Gather") and any(not self.prog.tensors[o].local for o in cmd.operands)

    def dma_bytes(self, cmd: Instr) -> tuple[int, int]:
        """(bytes moved, the global address they are read from or written to)."""
        t = self.prog.tensors
        if cmd.op == "Load":
            return nbytes(t[cmd.result]), t[cmd.operands[0]].address
        if cmd.op == "Store":
            return nbytes(t[cmd.operands[0]]), t[cmd.result].address
        # A DMA gather reads one row of every global table (an A16Gather's weight, scale, zero point) per index.
        tables = [t[o] for o in cmd.operands if not t[o].local]
        indices = next((t[o] for o in cmd.operands if t[o].local), None)
        rows = math.prod(indices.shape) if indices else 1
        return rows * sum(nbytes(tab) // max(tab.shape[0], 1) for tab in tables), tables[0].address

    def work(self, cmd: Instr) -> tuple[float, float]:
        """(MAC flops, vector operations) of a compute command."""
        t = self.prog.tensors
        out = t[cmd.result]
        a = cmd.attrs
        if cmd.op in MAC_OPS:
            x = t[cmd.operands[0]]
            k = x.shape[-1]
            n = a["g_out"][2] if "g_out" in a else out.shape[-1]
            rows = math.prod(x.shape) // k
            eu = rows * n * ADD_OPS if len(cmd.operands) in (3, 5) else 0  # a bias
            if cmd.op == "A16MatMul":
                eu += n * k * DEQUANT_OPS[4 if a.get("packed") else 8]
            return 2.0 * rows * k * n, float(eu)
        if cmd.op in ATTENTION_OPS:
            return self._attention(cmd)
        if cmd.op in RECURRENCE_OPS:  # the gated delta rule: q [1, n, Hk, dk], v [1, n, Hv, dv]
            _, n, _, dk = t[cmd.operands[0]].shape
            _, _, hv, dv = t[cmd.operands[2]].shape
            return delta_rule_work(n, hv, dk, dv, a["chunk_size"])
        if cmd.op == "Concat":
            # Rows already in the result's allocation (a key block's pieces, loaded side by side) cost nothing.
            moved = [t[o] for o in cmd.operands if t[o].buffer < 0 or t[o].buffer != out.buffer]
            return 0.0, float(sum(math.prod(x.shape) for x in moved))
        elems = a["g_out"][2] * math.prod(out.shape) // out.shape[a["g_out"][0]] if "g_out" in a else \
            math.prod(out.shape)
        return 0.0, float(elems * EU_OPS_PER_ELEMENT[cmd.op])

    def _attention(self, cmd: Instr) -> tuple[float, float]:
        """(MAC flops, vector operations) of an attention command: whole, a block of heads, one key block
        of flash attention (scores, online softmax, rescaling the accumulator), or its end (the divide)."""
        t, a = self.prog.tensors, cmd.attrs
        heads, d = a["q_head"], a["dim"]
        if a.get("g_flash") == "end":
            rows = t[cmd.operands[0]].shape[3]
            return 0.0, float(heads * rows * d)
        queries, keys = t[cmd.operands[0]].shape[1], t[cmd.operands[1]].shape[1]
        eu = heads * queries * keys * SOFTMAX_OPS
        if a.get("g_flash") == "block":
            eu += heads * queries * (d + FLASH_RESCALE_OPS)
        return 4.0 * queries * keys * heads * d, float(eu)

    def compute_s(self, cmd: Instr) -> tuple[float, float, float]:
        flops, eu = self.work(cmd)
        dtype = self.prog.tensors[cmd.operands[0]].dtype if cmd.operands else "f32"
        mac = self.rates.mac_flops_per_s(dtype if dtype in MAC_DTYPES else "f32") * self.eff.mac
        return flops / mac + eu / self.rates.eu_ops_per_s, flops, eu


def region_of(address: int, regions: dict[str, tuple[int, int]]) -> str:
    for name, (base, size) in regions.items():
        if base <= address < base + size:
            return name
    return "other"


class Engines:
    """The two engines' timelines across the nets of a step, and the bookkeeping of local memory."""

    def __init__(self, rates: Rates, eff: Efficiency, regions: dict[str, tuple[int, int]]):
        self.rates, self.eff, self.regions = rates, eff, regions
        self.dma = self.tiu = 0.0

    @property
    def end(self) -> float:
        return max(self.dma, self.tiu)

    def run_net(self, prog: Program) -> NetTime:
        start = self.dma = self.tiu = self.end  # the net's input is the previous net's output
        cost = CommandCost(prog, self.rates, self.eff)
        ready: dict[int, float] = {}  # local buffer -> end of its last write
        last_use: dict[int, float] = {}  # local buffer -> end of its last read or write
        allocs: list[tuple[int, int, int]] = []  # (lo, hi, buffer) of local allocations, oldest first
        stored: list[tuple[int, int, float]] = []  # (lo, hi, end) of global bytes written by Stores
        scratch_ids = iter(range(-1, -(10**9), -1))
        groups, previous = [], start
        tensors = prog.tensors
        extent = allocation_extents(prog)

        def claim(lo: int, hi: int, buffer: int) -> float:
            """Allocate lo..hi for `buffer`: when may it be written (every overlapped allocation dead)."""
            nonlocal allocs
            wait, keep = 0.0, []
            for a_lo, a_hi, b in allocs:
                if a_lo < hi and lo < a_hi and b != buffer:
                    wait = max(wait, last_use.get(b, 0.0))
                    if lo <= a_lo and a_hi <= hi:
                        continue  # fully covered: later claims wait on `buffer`, which ends later
                keep.append((a_lo, a_hi, b))
            allocs = [*keep, (lo, hi, buffer)]
            return wait

        for g in prog.groups:
            gt = GroupTime(g.index, 0.0, 0, 0.0, 0.0, 0.0, 0.0)
            end_g = previous
            for cmd in g.cmds:
                t0 = 0.0
                local_in = [tensors[o].buffer for o in cmd.operands if tensors[o].local]
                t0 = max([t0, *(ready.get(b, 0.0) for b in local_in)])
                out = tensors[cmd.result]
                scratch = None
                if out.local and out.buffer not in ready:
                    t0 = max(t0, claim(*extent[out.buffer], out.buffer))  # the whole allocation, every view
                if "scratch" in cmd.attrs:
                    lo, size = cmd.attrs["scratch"]
                    scratch = next(scratch_ids)
                    t0 = max(t0, claim(lo, lo + size, scratch))
                if cost.is_dma(cmd):
                    size, address = cost.dma_bytes(cmd)
                    if cmd.op == "Load":
                        src = tensors[cmd.operands[0]]
                        lo, hi = src.address, src.address + nbytes(src)
                        t0 = max([t0, *(e for s_lo, s_hi, e in stored if s_lo < hi and lo < s_hi)])
                    d = size / cost.dma_rate
                    begin = max(self.dma, t0)
                    self.dma = end = begin + d
                    if cmd.op == "Store":
                        stored.append((out.address, out.address + nbytes(out), end))
                    gt.dma_bytes += size
                    gt.dma_s += d
                    region = region_of(address, self.regions)
                    gt.bytes_by_region[region] = gt.bytes_by_region.get(region, 0) + size
                else:
                    c, flops, eu = cost.compute_s(cmd)
                    begin = max(self.tiu, t0)
                    self.tiu = end = begin + c
                    gt.compute_s += c
                    gt.flops += flops
                    gt.eu_ops += eu
                for b in local_in:
                    last_use[b] = max(last_use.get(b, 0.0), end)
                if out.local:
                    ready[out.buffer] = max(ready.get(out.buffer, 0.0), end)
                    last_use[out.buffer] = max(last_use.get(out.buffer, 0.0), end)
                if scratch is not None:
                    last_use[scratch] = end
                end_g = max(end_g, end)
            gt.estimated_seconds = end_g - previous
            previous = end_g
            groups.append(gt)
        return NetTime(prog.net, prog.stage, prog.layer, self.end - start, groups)


def allocation_extents(prog: Program) -> dict[int, tuple[int, int]]:
    """Local allocation -> the bytes its views cover (a key block is loaded in pieces, a view each)."""
    out: dict[int, tuple[int, int]] = {}
    for g in prog.groups:
        for cmd in g.cmds:
            for i in (*cmd.operands, cmd.result):
                t = prog.tensors[i]
                if t.local:
                    lo, hi = out.get(t.buffer, (t.address, t.address))
                    out[t.buffer] = (min(lo, t.address), max(hi, t.address + nbytes(t)))
    return out


def time_programs(progs: list[Program], rates: Rates, eff: Efficiency,
                  regions: dict[str, tuple[int, int]] | None = None) -> list[NetTime]:
    """Each program timed as a net of one step, back to back, in the order given."""
    engines = Engines(rates, eff, regions or {})
    return [engines.run_net(p) for p in progs]

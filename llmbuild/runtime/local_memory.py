"""The device's local memory, and the execution of a program's layer groups through it.

Local memory is one byte array of the chip's size (npu_lanes x lmem_bytes_per_lane). Compute commands
read and write only local memory (the one exception is a Gather's table, which the chip reads from
global memory by DMA, row by row); data enters and leaves only through the program's Load and Store
commands, at the program's addresses. So a wrong local or global address gives wrong numbers, as on the
chip, and the simulator also refuses, with a one-line `DeviceFault` naming the net, group, command and
numbers:
- any access past the end of local memory (a group larger than the chip's local memory);
- a write that lands on a live buffer: one written earlier in the group and still to be read (two live
  buffers overlapping, e.g. a double buffer whose two halves coincide). An allocation is claimed whole
  (every view of it: a key block whose rows arrive in pieces) when it is first written;
- a read of local bytes nothing in this group has written (data does not survive a group).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from llmbuild.binary.program import Group, Instr, Program, TensorDesc
from llmbuild.numerics.formats import STORAGE, decode, encode, round_to
from llmbuild.numerics.kernels import KERNELS
from llmbuild.runtime.faults import DeviceFault


class GlobalMemory(Protocol):
    """What the group runner needs of the device's global memory (runtime/device.py's Device)."""

    def _raw(self, desc: TensorDesc) -> np.ndarray: ...
    def check_writable(self, desc: TensorDesc) -> None: ...
    def read(self, desc: TensorDesc) -> np.ndarray: ...

Trace = Callable[[str, np.ndarray], None]


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _nbytes(t: TensorDesc) -> int:
    return STORAGE[t.dtype][0] * _count(t.shape)


def _slice(rank: int, axis: int, start: int, length: int) -> tuple[slice, ...]:
    index = [slice(None)] * rank
    index[axis] = slice(start, start + length)
    return tuple(index)


class GroupRun:
    """One group's commands on the device's global memory and a local memory."""

    def __init__(self, device: GlobalMemory, lmem: np.ndarray, prog: Program, group: Group,
                 pieces: dict[str, np.ndarray] | None):
        self.dev, self.lmem, self.prog, self.g, self.pieces = device, lmem, prog, group, pieces
        self.tensors = prog.tensors
        # Last command touching each allocation: after it the allocation is dead and its bytes free.
        self.last: dict[int, int] = {}
        self.extent: dict[int, tuple[int, int]] = {}  # allocation -> the bytes its views cover
        for i, cmd in enumerate(group.cmds):
            for t in (*cmd.operands, cmd.result):
                desc = self.tensors[t]
                if desc.local:
                    self.last[desc.buffer] = i
                    lo, hi = self.extent.get(desc.buffer, (desc.address, desc.address))
                    self.extent[desc.buffer] = (min(lo, desc.address), max(hi, desc.address + _nbytes(desc)))
        self.live: dict[int, tuple[int, int, int]] = {}  # buffer -> (lo, hi, command that wrote it)
        self.i = 0

    def fault(self, msg: str) -> None:

        cmd = self.g.cmds[self.i]
        raise DeviceFault(f"{self.prog.net}: group {self.g.index}: command {self.i} ({cmd.op} {cmd.loc}): {msg}")

    # ---- local memory ---------------------------------------------------------------------------

    def _bounds(self, lo: int, hi: int) -> None:
        if lo < 0 or hi > self.lmem.size:
            self.fault(f"local access {lo:#x}..{hi:#x} beyond local memory ({self.lmem.size:#x} bytes)")

    def _view(self, t: TensorDesc) -> np.ndarray:
        lo, hi = t.address, t.address + _nbytes(t)
        self._bounds(lo, hi)
        return self.lmem[lo:hi].view(STORAGE[t.dtype][1]).reshape(t.shape)

    def _claim(self, lo: int, hi: int, buffer: int) -> None:
        """`buffer` is about to be written at lo..hi: no other live buffer may hold those bytes."""
        self._bounds(lo, hi)
        if buffer in self.live:
            return
        if buffer in self.extent:  # the whole allocation, not only the view written first
            lo, hi = min(lo, self.extent[buffer][0]), max(hi, self.extent[buffer][1])
            self._bounds(lo, hi)
        for a, b, at in self.live.values():
            if a < hi and lo < b:
                cmd = self.g.cmds[at]
                self.fault(f"writes local {lo:#x}..{hi:#x} over live buffer {a:#x}..{b:#x} "
                           f"(written by command {at}, {cmd.op} {cmd.loc}, still to be read)")
        self.live[buffer] = (lo, hi, self.i)

    def read_local(self, t: TensorDesc) -> np.ndarray:
        if t.buffer not in self.live:
            self.fault(f"reads local {t.address:#x}..{t.address + _nbytes(t):#x} before anything in this "
                       "group wrote it")
        return self._view(t)

    def write_local(self, t: TensorDesc, raw: np.ndarray, part: tuple[slice, ...] | None = None) -> None:
        self._claim(t.address, t.address + _nbytes(t), t.buffer)
        view = self._view(t)
        if part is None:
            view[...] = raw.reshape(t.shape)
        else:
            view[part] = raw

    # ---- commands -------------------------------------------------------------------------------

    def run(self) -> None:
        for i, cmd in enumerate(self.g.cmds):
            self.i = i
            if cmd.op == "Load":
                self._load(cmd)
            elif cmd.op == "Store":
                self._store(cmd)
            else:
                self._compute(cmd)
            for b in [b for b in self.live if self.last.get(b, -1) <= self.i]:
                del self.live[b]
        self.live.clear()

    def _global_part(self, cmd: Instr, g: TensorDesc, local: TensorDesc) -> tuple[slice, ...]:
        """The part of global tensor `g` a transfer moves: `axis`/`start` (-1: the whole tensor), or lists
        of both (a slice along several axes, e.g. a mask tile); the local tensor gives the lengths."""
        axis, start = cmd.attrs["axis"], cmd.attrs["start"]
        axes, starts = (axis, start) if isinstance(axis, list) else ([axis], [start])
        if axes == [-1]:
            if g.shape != local.shape:
                self.fault(f"whole transfer of {list(g.shape)} into {list(local.shape)}")
            return tuple(slice(None) for _ in g.shape)
        index = [slice(None)] * len(g.shape)
        want = list(g.shape)
        for a, s in zip(axes, starts, strict=True):
            if not 0 <= a < len(g.shape) or s < 0 or s + local.shape[a] > g.shape[a]:
                self.fault(f"slice {s}+{local.shape[a] if 0 <= a < len(local.shape) else '?'} on axis {a} "
                           f"of {list(g.shape)} does not match {list(local.shape)}")
            index[a] = slice(s, s + local.shape[a])
            want[a] = local.shape[a]
        if tuple(want) != local.shape:
            self.fault(f"slice {starts} on axes {axes} of {list(g.shape)} does not match {list(local.shape)}")
        return tuple(index)

    def _load(self, cmd: Instr) -> None:
        src, dst = self.tensors[cmd.operands[0]], self.tensors[cmd.result]
        if src.local or not dst.local:
            self.fault("a load moves global memory to local memory")
        raw = self.dev._raw(src)[self._global_part(cmd, src, dst)]
        self.write_local(dst, raw)

    def _store(self, cmd: Instr) -> None:
        src, dst = self.tensors[cmd.operands[0]], self.tensors[cmd.result]
        if not src.local or dst.local:
            self.fault("a store moves local memory to global memory")
        self.dev.check_writable(dst)
        part = self._global_part(cmd, dst, src)
        self.dev._raw(dst)[part] = self.read_local(src)

    def _compute(self, cmd: Instr) -> None:
        attrs = cmd.attrs
        g_in = attrs.get("g_in", [])
        cuts = {g_in[k]: (g_in[k + 1], g_in[k + 2], g_in[k + 3]) for k in range(0, len(g_in), 4)}
        args = []
        for n, t in enumerate(cmd.operands):
            desc = self.tensors[t]
            if not desc.local:
                lookup = cmd.op == "Gather" and n == 0 and attrs.get("axis") == 0
                dma_table = lookup or (cmd.op == "A16Gather" and n < 3)
                if not dma_table:
                    self.fault(f"operand {n} is in global memory: compute reads local memory only")
                args.append(self.dev.read(desc))
                continue
            value = decode(self.read_local(desc), desc.dtype)
            if n in cuts:
                value = np.ascontiguousarray(value[_slice(value.ndim, *cuts[n])])
            args.append(value)
        out = self.tensors[cmd.result]
        if not out.local:
            self.fault("the result is in global memory: compute writes local memory only")
        if "scratch" in attrs:  # attention's scores live here while the command runs
            lo, size = attrs["scratch"]
            self._claim(lo, lo + size, -1 - self.i)
            self.lmem[lo : lo + size] = 0xFF
            del self.live[-1 - self.i]
        result = round_to(np.asarray(KERNELS[cmd.op](attrs, *args), dtype=np.float32), out.dtype)
        part = _slice(len(out.shape), *attrs["g_out"]) if "g_out" in attrs else None
        self.write_local(out, encode(result, out.dtype), part)
        if self.pieces is not None and attrs.get("g_flash") != "block":  # a block's result is the state
            self._keep(cmd, out, result)

    def _keep(self, cmd: Instr, out: TensorDesc, result: np.ndarray) -> None:
        """Assemble each op's whole result from its pieces, for the per-op checks."""
        whole = self.pieces.get(cmd.loc)  # type: ignore[union-attr]
        if whole is None:
            shape = next(self.tensors[i.result].shape for i in self.prog.instrs if i.loc == cmd.loc)
            whole = self.pieces[cmd.loc] = np.zeros(shape, dtype=np.float32)  # type: ignore[index]
        index: list[Any] = [slice(None)] * whole.ndim
        if "g_row" in cmd.attrs:
            index[1] = slice(cmd.attrs["g_row"], cmd.attrs["g_row"] + out.shape[1])
        for key in ("g_out", "g_piece"):
            if key in cmd.attrs:
                axis, start, length = cmd.attrs[key]
                index[axis] = slice(start, start + length)
        whole[tuple(index)] = result.reshape(whole[tuple(index)].shape)


def run_groups(device: GlobalMemory, prog: Program, lmem: np.ndarray, trace: Trace | None,
               active_rows: int | None = None) -> None:
    """`active_rows`: only the first rows (tokens) are checked; a row-tiled group runs the tiles that hold
    them, and at least two, so both halves of every ping-pong pair are exercised (codegen tags each
    command with its tile: `g_tile`). The skipped tiles' rows of each stored value are zero, as the host's
    kernels leave rows past `active_rows` (an op that mixes every row, such as the gated delta rule's final
    state over a prefill's padding, then reads finite rows, as it does from a whole run)."""
    pieces: dict[str, np.ndarray] | None = {} if trace is not None else None
    for group in prog.groups:
        skipped: list[Instr] = []
        if active_rows is not None and group.tile_rows and group.rows > active_rows:
            keep = max(2, -(-active_rows // group.tile_rows))
            skipped = [c for c in group.cmds if c.op == "Store" and c.attrs.get("g_tile", 0) >= keep]
            group = replace(group, cmds=[c for c in group.cmds if c.attrs.get("g_tile", 0) < keep])
        run = GroupRun(device, lmem, prog, group, pieces)
        run.run()
        for store in skipped:
            dst = prog.tensors[store.result]
            device.check_writable(dst)
            device._raw(dst)[run._global_part(store, dst, prog.tensors[store.operands[0]])] = 0
    if trace is not None and pieces is not None:
        for ins in prog.instrs:
            if ins.loc in pieces:
                trace(ins.loc, pieces[ins.loc])

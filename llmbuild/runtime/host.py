"""The fast host path: the same binary and the same program instructions as the simulated device, with
values kept as numpy arrays instead of bytes at addresses.

Each program is resolved once, at load, into a list of steps whose operands are already bound: a weight
(decoded from its storage type once, and shared by every net that addresses it), the result of an
earlier step of the same program (a Reshape view that emitted no instruction becomes a reshape of that
result), or a fixed buffer (net inputs and outputs, the KV cache) looked up by its address when the step
runs. Every step calls the same kernel as the device on operands of the same shapes, C-contiguous as the
device reads them, and rounds its result to the stored element type exactly as the device does, so the
two paths give bit-identical values; the device stays the reference for verification (it catches wrong
addresses and overlapping buffers, which this path by construction cannot see).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.codegen.program import Program, TensorDesc
from llmbuild.numerics.formats import STORAGE, decode, round_to
from llmbuild.numerics.kernels import KERNELS
from llmbuild.runtime.blas import one_thread, vector_only

Getter = Callable[[], np.ndarray]


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _fit(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`value` read as a tensor of `shape` at the same address: the device reads the leading elements."""
    if value.shape == shape:
        return value
    need = _count(shape)
    if value.size == need:
        return value.reshape(shape)
    if value.size > need:
        return value.reshape(-1)[:need].reshape(shape)
    raise LlmbuildError(f"host path: reading {need} elements from a buffer that holds {value.size}")


# Ops that only move values: a result whose every value operand already has the result's precision
# needs no rounding (rounding a bf16 value to bf16 is the identity), and a moved KV cache is large.
_MOVES = frozenset({"Gather", "Reshape", "Permute", "Concat"})
_EXACT_IN = {"f32": ("f32", "f16", "bf16"), "f16": ("f16",), "bf16": ("bf16",), "i32": ()}


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """formats.round_to(x, "bf16") bit for bit, in place on one temporary (the host's hottest store)."""
    bits = x.view(np.uint32)
    out = bits >> 16
    out &= 1
    out += 0x7FFF
    out += bits
    out &= 0xFFFF0000
    result = out.view(np.float32)
    nan = np.isnan(x)
    if nan.any():
        result[nan] = np.uint32(0x7FC00000).view(np.float32)
    return result


def _rounder(dtype: str, exact: bool) -> Callable[[Any], np.ndarray]:
    """The device's store: f32 first, then the element type's rounding; always C-contiguous, because
    the device reads every operand back from memory that way (and BLAS results depend on the layout)."""
    if exact or dtype == "f32":
        return lambda result: np.ascontiguousarray(result, dtype=np.float32)
    if dtype == "bf16":
        return lambda result: _round_bf16(np.ascontiguousarray(result, dtype=np.float32))
    return lambda result: np.ascontiguousarray(round_to(np.asarray(result, dtype=np.float32), dtype))


class _Step:
    __slots__ = ("fn", "attrs", "args", "store", "loc")

    def __init__(self, fn: Callable, attrs: dict, args: list[Getter], store: Callable, loc: str):
        self.fn, self.attrs, self.args, self.store, self.loc = fn, attrs, args, store, loc


class _HostProgram:
    """One program with every operand bound: run() executes it on the executor's buffers."""

    def __init__(self, prog: Program, host: HostExecutor):
        self.prog = prog
        self.vals: list[np.ndarray | None] = [None] * len(prog.instrs)
        producer: dict[int, int] = {}  # tensor index -> step index
        last_at: dict[int, int] = {}  # address -> the latest step that wrote there
        self.steps: list[_Step] = []
        for k, ins in enumerate(prog.instrs):
            args = [self._source(t, producer, last_at, host) for t in ins.operands]
            out = prog.tensors[ins.result]
            values = ins.operands[:1] if ins.op == "Gather" else ins.operands  # a Gather's indices are not moved
            exact = ins.op in _MOVES and all(prog.tensors[t].dtype in _EXACT_IN[out.dtype] for t in values)
            self.steps.append(_Step(KERNELS[ins.op], ins.attrs, args, _rounder(out.dtype, exact), ins.loc))
            producer[ins.result] = k
            last_at[out.address] = k
        self.outputs: dict[str, tuple[int, Getter]] = {
            name: (prog.tensors[t].address, self._source(t, producer, last_at, host)) for name, t in prog.outputs
        }
        self.output_descs = {name: prog.tensors[t] for name, t in prog.outputs}
        # Only one-row operands (decode, lm_head): BLAS on one thread gives the same bits, faster (blas.py).
        self.vector_only = vector_only(prog)

    def _source(self, t: int, producer: dict[int, int], last_at: dict[int, int], host: HostExecutor) -> Getter:
        desc = self.prog.tensors[t]
        if host.in_weights(desc):
            w = host.weight(desc)
            return lambda: w
        vals = self.vals
        k = producer.get(t)
        if k is not None:
            return lambda: vals[k]
        k = last_at.get(desc.address)
        if k is not None:  # a view (a Reshape that emitted nothing) of an earlier result
            shape = desc.shape
            return lambda: _fit(vals[k], shape)
        buffers, address, shape = host.buffers, desc.address, desc.shape
        return lambda: _fit(buffers[address], shape)

    def run(self) -> None:
        vals = self.vals
        for k, step in enumerate(self.steps):
            vals[k] = step.store(step.fn(step.attrs, *[get() for get in step.args]))


class HostExecutor:
    """Runs programs on host arrays. Same interface as `Device` for what the runtime loop needs."""

    def __init__(self, weights: memoryview | bytes, weight_region: tuple[int, int]):
        self.weight_bytes = np.frombuffer(weights, dtype=np.uint8)
        self.weight_region = weight_region
        self.buffers: dict[int, np.ndarray] = {}  # address -> the value last stored there
        self._weights: dict[tuple[int, str, tuple[int, ...]], np.ndarray] = {}
        self._programs: dict[int, _HostProgram] = {}

    # ---- weights: decoded once, shared by every net that addresses them ----------------------

    def in_weights(self, t: TensorDesc) -> bool:
        lo, size = self.weight_region
        return lo <= t.address < lo + size

    def weight(self, t: TensorDesc) -> np.ndarray:
        key = (t.address, t.dtype, t.shape)
        cached = self._weights.get(key)
        if cached is None:
            nbytes, dt = STORAGE[t.dtype]
            end = t.address + nbytes * _count(t.shape)
            if end > self.weight_bytes.size:
                raise LlmbuildError(f"host path: weight {t.address:#x}..{end:#x} outside the weight image")
            raw = self.weight_bytes[t.address : end].view(dt).reshape(t.shape)
            cached = np.ascontiguousarray(decode(raw, t.dtype))
            self._weights[key] = cached
        return cached

    # ---- the runtime loop's interface ----------------------------------------------------------

    def _program(self, prog: Program) -> _HostProgram:
        hp = self._programs.get(id(prog))
        if hp is None or hp.prog is not prog:
            hp = _HostProgram(prog, self)
            self._programs[id(prog)] = hp
        return hp

    def set_input(self, prog: Program, name: str, value: np.ndarray) -> None:
        for n, t in prog.inputs:
            if n == name:
                desc = prog.tensors[t]
                self.buffers[desc.address] = np.ascontiguousarray(round_to(np.asarray(value).reshape(desc.shape),
                                                                           desc.dtype))
                return
        raise KeyError(f"{prog.net} has no input {name}")

    def run(self, prog: Program, trace: Callable[[str, np.ndarray], None] | None = None) -> None:
        hp = self._program(prog)
        if hp.vector_only:
            with one_thread():
                hp.run()  # the caller holds np.errstate once per token (CompiledModel), not once per net
        else:
            hp.run()
        if trace is not None:
            for step, value in zip(hp.steps, hp.vals, strict=True):
                trace(step.loc, value)
        for address, get in hp.outputs.values():
            self.buffers[address] = get()

    def get_output(self, prog: Program, name: str) -> np.ndarray:
        hp = self._program(prog)
        desc = hp.output_descs.get(name)
        if desc is None:
            raise KeyError(f"{prog.net} has no output {name}")
        return _fit(self.buffers[desc.address], desc.shape)

    def kv_buffer(self, slot: TensorDesc) -> np.ndarray:
        """Layer i's persistent cache, as values: programs read it in place through their history inputs."""
        buf = self.buffers.get(slot.address)
        if buf is None or buf.shape != slot.shape:
            buf = np.zeros(slot.shape, dtype=np.float32)
            self.buffers[slot.address] = buf
        return buf

    def copy_rows(self, src: TensorDesc, dst: TensorDesc, at: int, rows: int) -> None:
        """Rows [0, rows) of the buffer at `src` into rows [at, at+rows) of the cache at `dst` (axis 1)."""
        new = _fit(self.buffers[src.address], src.shape)
        self.kv_buffer(dst)[0, at : at + rows] = new[0, :rows]

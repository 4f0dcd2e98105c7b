"""The fast host path: the same binary and the same program instructions as the simulated device, with
values kept as numpy arrays instead of bytes at addresses.

Each program is resolved once, when first run, into steps whose operands are already bound: a weight
(decoded from its storage type once, and shared by every net that addresses it), the result of an
earlier step of the same program (a Reshape view that emitted no instruction becomes a reshape of that
result), or a fixed buffer (net inputs and outputs, the KV cache) looked up by its address when the step
runs. Every step calls the same kernel as the device on operands of the same shapes, C-contiguous as the
device reads them, and rounds its result to the stored element type exactly as the device does, so the
two paths give bit-identical values; the device stays the reference for verification (it catches wrong
addresses and overlapping buffers, which this path by construction cannot see).

What this path saves, besides the byte round trips: a result that only moves values skips a rounding that
cannot change it, and the Concat of a layer's whole cache with the new rows (every layer, every token)
writes the rows after the cache, in place, instead of copying the cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.codegen.program import Instr, Program, TensorDesc
from llmbuild.numerics.formats import STORAGE, decode, round_to
from llmbuild.numerics.kernels import KERNELS
from llmbuild.runtime.blas import ThreadChoice, one_thread, vector_only

Getter = Callable[[], np.ndarray]
Run = Callable[[], None]

# Ops that only move values: a result whose every value operand already has the result's precision needs
# no rounding (rounding a bf16 value to bf16 is the identity).
_MOVES = frozenset({"Gather", "Reshape", "Permute", "Concat"})
_EXACT_IN = {"f32": ("f32", "f16", "bf16"), "f16": ("f16",), "bf16": ("bf16",), "i32": ()}


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


def _bind(k: int, vals: list, fn: Callable, attrs: dict, args: list[Getter], store: Callable) -> Run:
    """Step k as one closure (fewer Python calls per step than a generic loop over its operands)."""
    if len(args) == 1:
        (a,) = args

        def run1() -> None:
            vals[k] = store(fn(attrs, a()))

        return run1
    if len(args) == 2:
        a, b = args

        def run2() -> None:
            vals[k] = store(fn(attrs, a(), b()))

        return run2

    def run() -> None:
        vals[k] = store(fn(attrs, *[get() for get in args]))

    return run


class _HostProgram:
    """One program with every operand bound: run() executes it on the executor's buffers."""

    def __init__(self, prog: Program, host: HostExecutor):
        self.prog = prog
        self.vals: list[np.ndarray | None] = [None] * len(prog.instrs)
        # Only one-row operands (decode, lm_head): any BLAS thread count gives the same bits (blas.py).
        self.vector_only = vector_only(prog)
        self._producer: dict[int, int] = {}  # tensor index -> step index
        self._last_at: dict[int, int] = {}  # address -> the latest step that wrote there
        self.steps: list[Run] = []
        for k, ins in enumerate(prog.instrs):
            args = [self._source(t, host) for t in ins.operands]
            self.steps.append(self._step(k, ins, args, host))
            self._producer[ins.result] = k
            self._last_at[prog.tensors[ins.result].address] = k
        self.outputs = [(prog.tensors[t].address, self._source(t, host)) for _, t in prog.outputs]
        self.output_descs = {name: prog.tensors[t] for name, t in prog.outputs}

    def _source(self, t: int, host: HostExecutor) -> Getter:
        """How a step reads tensor t: a weight, an earlier step's result (or a view of it), or a buffer."""
        desc = self.prog.tensors[t]
        if host.in_weights(desc):
            w = host.weight(desc)
            return lambda: w
        vals = self.vals
        k = self._producer.get(t)
        if k is not None:
            return lambda: vals[k]
        k = self._last_at.get(desc.address)
        if k is not None:  # a view (a Reshape that emitted nothing) of an earlier result
            shape = desc.shape
            return lambda: _fit(vals[k], shape)
        buffers, address, shape = host.buffers, desc.address, desc.shape
        return lambda: _fit(buffers[address], shape)

    def _step(self, k: int, ins: Instr, args: list[Getter], host: HostExecutor) -> Run:
        tensors = self.prog.tensors
        out = tensors[ins.result]
        values = ins.operands[:1] if ins.op == "Gather" else ins.operands  # a Gather's indices are not moved
        exact = ins.op in _MOVES and all(tensors[t].dtype in _EXACT_IN[out.dtype] for t in values)
        fn: Callable = KERNELS[ins.op]
        store = _rounder(out.dtype, exact)
        if ins.op == "Concat" and exact and ins.attrs["axis"] == 1 and len(ins.operands) == 2:
            in_place = host.cache_concat(tensors[ins.operands[0]])
            if in_place is not None:
                fn, store = in_place, _same
        return _bind(k, self.vals, fn, ins.attrs, args, store)

    def run(self) -> None:
        for step in self.steps:
            step()


def _same(x: np.ndarray) -> np.ndarray:
    return x


class HostExecutor:
    """Runs programs on host arrays. Same interface as `Device` for what the runtime loop needs."""

    def __init__(
        self, weights: memoryview | bytes, weight_region: tuple[int, int], kv_slots: Iterable[TensorDesc] = (),
        extra_rows: int = 0,
    ):
        self.weight_bytes = np.frombuffer(weights, dtype=np.uint8)
        self.weight_region = weight_region
        self.buffers: dict[int, np.ndarray] = {}  # address -> the value last stored there
        self._weights: dict[tuple[int, str, tuple[int, ...]], np.ndarray] = {}
        self._programs: dict[int, _HostProgram] = {}
        self._threads = ThreadChoice()  # BLAS threads for matrix-vector programs (blas.py)
        # Each layer's cache, with `extra_rows` rows after it where a Concat puts the new rows (cache_concat).
        self._kv: dict[int, tuple[TensorDesc, np.ndarray]] = {}
        for slot in kv_slots:
            storage = np.zeros((slot.shape[0], slot.shape[1] + extra_rows, *slot.shape[2:]), dtype=np.float32)
            self._kv[slot.address] = (slot, storage)
            self.buffers[slot.address] = storage[:, : slot.shape[1]]

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
            cached.flags.writeable = False  # read-only: kernels may cache what they derive (dequantized weights)
            self._weights[key] = cached
        return cached

    def cache_concat(self, history: TensorDesc) -> Callable[..., np.ndarray] | None:
        """Concat(history, new) on axis 1 for a layer's whole cache: the new rows are written after the
        cache, in place, and the result is the leading rows (the same values as a copy, none copied)."""
        found = self._kv.get(history.address)
        if found is None or found[0].shape != history.shape:
            return None
        S, storage = history.shape[1], found[1]

        def concat(attrs: dict[str, Any], cache: np.ndarray, new: np.ndarray) -> np.ndarray:
            rows = new.shape[1]
            if S + rows > storage.shape[1]:
                return np.concatenate([cache, new], axis=1)
            storage[:, S : S + rows] = new
            return storage[:, : S + rows]

        return concat

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
                value = round_to(np.asarray(value).reshape(desc.shape), desc.dtype)
                self.buffers[desc.address] = np.ascontiguousarray(value)
                return
        raise KeyError(f"{prog.net} has no input {name}")

    def run(self, prog: Program, trace: Callable[[str, np.ndarray], None] | None = None) -> None:
        hp = self._program(prog)
        # The caller holds np.errstate once per token (CompiledModel), not once per net.
        if hp.vector_only:
            with self._threads.run(prog.stage if prog.layer >= 0 else prog.net):
                hp.run()
        else:
            with one_thread():  # matrix products: tiles on threads, one BLAS thread each (numerics/parallel.py)
                hp.run()
        if trace is not None:
            for ins, value in zip(prog.instrs, hp.vals, strict=True):
                trace(ins.loc, value)
        for address, get in hp.outputs:
            self.buffers[address] = get()

    def get_output(self, prog: Program, name: str) -> np.ndarray:
        desc = self._program(prog).output_descs.get(name)
        if desc is None:
            raise KeyError(f"{prog.net} has no output {name}")
        return _fit(self.buffers[desc.address], desc.shape)

    def copy_rows(self, src: TensorDesc, dst: TensorDesc, at: int, rows: int) -> None:
        """Rows [0, rows) of the buffer at `src` into rows [at, at+rows) of the cache at `dst` (axis 1)."""
        new = _fit(self.buffers[src.address], src.shape)
        cache = self.buffers.get(dst.address)
        if cache is None or cache.shape != dst.shape:
            cache = self.buffers[dst.address] = np.zeros(dst.shape, dtype=np.float32)
        cache[0, at : at + rows] = new[0, :rows]

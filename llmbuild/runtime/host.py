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
cannot change it, the Concat of a layer's whole cache with the new rows (every layer, every token)
writes the rows after the cache, in place, instead of copying the cache, and a prefill of n tokens
computes only its n rows in products and the row tiles holding them in attention (`active_rows`: a
product's row depends on that row alone, attention's tiles are the device's, so the same bits).

Memory: weights stay in the binary's format, in the file (read as they are used: runtime/weight_image.py),
or in a build job's weight file. Copies are kept while they fit `cache_bytes`: 16-bit weights as stored
(the product kernels read them as they are: numerics/weight_product.py), a 4-bit matrix dequantized to
bf16 bits, an f32 model's weights decoded; the rest is handed to the kernels as `StoredTensor`s and read
a block of rows at a time as products use them, large 4-bit projections as levels, so a 7B w4 binary runs
in about its own size plus the cache, and SmolLM2 keeps every weight, in 270 MB.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.binary.program import Instr, Program, TensorDesc
from llmbuild.numerics import buffer_pool, compiled_dequant, compiled_round, levels_product, vector_product
from llmbuild.numerics.dequantize import dequantize_bf16_bits, dequantize_uncached
from llmbuild.numerics.formats import STORAGE, compute_dtype, decode, round_to
from llmbuild.numerics.kernels import KERNELS, ROW_LOCAL, ROW_SKIPPING, on_real_rows
from llmbuild.numerics.parallel import one_thread
from llmbuild.numerics.stored import StoredTensor, materialize
from llmbuild.numerics.weight_product import plus_bias, tiled_product
from llmbuild.runtime.weight_image import FlatImage, WeightImage

Getter = Callable[[], Any]
Run = Callable[[], None]

# Weights kept in memory by default (LLMBUILD_HOST_CACHE_MB overrides): this, or the binary's weight
# region when that is larger, so that a 7B w4 model's decode reads every level and its bf16 lm_head from
# memory, not from the file each token (its binary is never mapped whole: resident memory stays under the
# binary's size plus 2 GiB). Every weight of a 135M model in float32, of a 1.5B w4 model in 16 bits. Large
# 4-bit projections are kept as their levels (`levels`), which the compiled kernels read as they are.
DEFAULT_CACHE_BYTES = 3 << 30
# Smaller weights (norms, biases, scales) are always decoded: a lazy read of them costs more than it saves.
ALWAYS_DECODED_BYTES = 1 << 20
# An input of at least this many values, given again as the same array, is rounded to its type once.
LARGE_INPUT = 1 << 20


def _reads_rows(op: str, operand: int) -> bool:
    """Whether the kernel of `op` takes its `operand` as a RowReader (read by rows in its storage format):
    a product's weight (not its bias), a gather's table, a quantized product's levels, scales and zeros."""
    return op in ("A16MatMul", "A16Gather", "Gather") or (op == "MatMul" and operand == 1)

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


def _rounder(dtype: str, exact: bool) -> Callable[[Any], np.ndarray]:
    """The device's store: f32 first, then the element type's rounding; always C-contiguous, because
    the device reads every operand back from memory that way (and BLAS results depend on the layout)."""
    if exact or dtype == "f32":
        return lambda result: np.ascontiguousarray(result, dtype=np.float32)
    if dtype == "bf16":
        return compiled_round.rounded_bf16
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
        self._row_attrs: list[dict[str, Any]] = []  # attrs of the steps that honour active_rows
        self.active: list[int | None] = [None]  # this run's active rows, read by row-local steps
        first = prog.tensors[prog.inputs[0][1]].shape if prog.inputs else (1,)
        self.tokens = first[1] if len(first) >= 2 else 1  # the net's static tokens
        self._producer: dict[int, int] = {}  # tensor index -> step index
        self._last_at: dict[int, int] = {}  # address -> the latest step that wrote there
        self._reads: list[int] = []  # the steps whose values the operands being bound read
        self.weight_reads: list[Getter] = []  # the steps' weights, read on first use (or by `load_weights`)
        self.steps: list[Run] = []
        last_read: dict[int, int] = {}  # step -> the last step that reads its value
        for k, ins in enumerate(prog.instrs):
            self._reads = []
            gathers = ins.op in ("Gather", "A16Gather")
            args = [self._source(t, host, _reads_rows(ins.op, i), gathers) for i, t in enumerate(ins.operands)]
            last_read.update(dict.fromkeys(self._reads, k))
            self.steps.append(self._step(k, ins, args, host))
            self._producer[ins.result] = k
            self._last_at[prog.tensors[ins.result].address] = k
        self._reads = []
        self.outputs = [(prog.tensors[t].address, self._source(t, host)) for _, t in prog.outputs]
        # A value is dropped after its last reader (outputs are read after the run): a vision tower's net
        # holds hundreds of values at a thousand tokens (2.1 GB for InternViT-300M) where a layer's holds few.
        kept = set(self._reads)
        self.free_after: list[list[int]] = [[] for _ in prog.instrs]
        for k, j in last_read.items():
            if k not in kept:
                self.free_after[j].append(k)
        self.output_descs = {name: prog.tensors[t] for name, t in prog.outputs}
        self.active_rows: int | None = None

    def _source(self, t: int, host: HostExecutor, lazy: bool = True, gathered: bool = False) -> Getter:
        """How a step reads tensor t: a weight, an earlier step's result (or a view of it), or a buffer.
        `lazy`: the step's kernel reads a weight in its storage format by rows (products, gathers);
        `gathered`: it reads only the rows it looks up (a table is then left in the file)."""
        desc = self.prog.tensors[t]
        if host.in_weights(desc):
            # Resolved on first use: an A16MatMul whose weight the host keeps dequantized never reads its
            # levels again, and must not spend the cache on them.
            cell: list = []

            def weight() -> Any:
                if not cell:
                    value = host.weight(desc, gathered)
                    # Elementwise kernels take arrays: a large constant that is not a product's weight (a
                    # vision tower's position embeddings) is decoded for them when the cache has no room.
                    cell.append(value if lazy else materialize(value))
                return cell[0]

            weight.reads_weight = True  # type: ignore[attr-defined]
            return weight
        vals = self.vals
        k = self._producer.get(t)
        if k is not None:
            self._reads.append(k)
            return lambda: vals[k]
        k = self._last_at.get(desc.address)
        if k is not None:  # a view (a Reshape that emitted nothing) of an earlier result
            self._reads.append(k)
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
        attrs = ins.attrs
        if ins.op in ROW_SKIPPING:
            attrs = dict(attrs)  # this program's own copy: `active_rows` is set on it per run
            self._row_attrs.append(attrs)
            if ins.op == "FAttention":  # the key blocks every real row's mask hides: the same bits unread
                attrs["hidden_key_blocks"] = "skip"
        if ins.op == "Concat" and exact and ins.attrs["axis"] == 1 and len(ins.operands) == 2:
            in_place = host.cache_concat(tensors[ins.operands[0]])
            if in_place is not None:
                fn, store = in_place, _same
        tokens = self.tokens
        if ins.op in ROW_SKIPPING and tokens > 1 and len(out.shape) >= 2 and out.shape[1] == tokens:
            store = _store_active_rows(store, self.active)
        if ins.op in ROW_LOCAL and tokens > 1 and len(out.shape) >= 2 and out.shape[1] == tokens:
            rows = [not host.in_weights(tensors[t]) and len(tensors[t].shape) >= 2 and tensors[t].shape[1] == tokens
                    for t in ins.operands]
            fn, store = _active_rows_only(fn, store, out.shape, rows, self.active), _same
        if ins.op == "A16MatMul" and all(host.in_weights(tensors[t]) for t in ins.operands[1:4]):
            weight, scale, zp = (tensors[t] for t in ins.operands[1:4])
            # A decode step's product reads the levels as stored (levels_product.py: a quarter of a bf16
            # copy's bytes streamed each token) wherever that kernel takes them; a prefill's products read
            # the cached bf16 copy, which does not have to be dequantized per block.
            one_row = int(np.prod(tensors[ins.operands[0]].shape[:-1])) == 1
            from_levels = one_row and host.decodes_from_levels(weight, scale, ins.attrs)
            prepared = None if from_levels else host.dequantized(weight, scale, zp, ins.attrs)
            if prepared is not None:
                fn, args = _with_weight(prepared), [args[0], *args[4:]]
            else:  # the kernels read the levels as stored (`levels`): no dequantized copy is kept
                levels_desc, zero_desc = tensors[ins.operands[1]], tensors[ins.operands[3]]
                args = [args[0], _weight_read(lambda: host.levels(levels_desc)), args[2],
                        _weight_read(lambda: host.zero_points(zero_desc)), *args[4:]]
        self.weight_reads += [get for get in args if getattr(get, "reads_weight", False)]
        return _bind(k, self.vals, fn, attrs, args, store)

    def load_weights(self) -> None:
        """Read every weight the program's steps read, now (the executor keeps what its cache holds)."""
        for get in self.weight_reads:
            get()

    def run(self, active_rows: int | None = None, keep: bool = False) -> None:
        """`keep`: every value stays until the run ends (a trace reads them all)."""
        self.active[0] = active_rows
        if active_rows != self.active_rows:
            for attrs in self._row_attrs:
                if active_rows is None:
                    attrs.pop("active_rows", None)
                else:
                    attrs["active_rows"] = active_rows
            self.active_rows = active_rows
        vals = self.vals
        for step, free in zip(self.steps, self.free_after, strict=True):
            step()
            if not keep:
                for k in free:
                    vals[k] = None


def _weight_read(get: Getter) -> Getter:
    """`get`, marked as a step's weight read (`_HostProgram.load_weights` calls it ahead of the run)."""
    get.reads_weight = True  # type: ignore[attr-defined]
    return get


def _same(x: np.ndarray) -> np.ndarray:
    return x


def _store_active_rows(store: Callable, active: list[int | None]) -> Callable[[np.ndarray], np.ndarray]:
    """A product's store while `active[0]` rows are real: those rows are rounded, the others (zeros, or the
    rest of a computed tile, which no real row depends on) are left as they are."""

    def run(result: np.ndarray) -> np.ndarray:
        n = active[0]
        if n is None or n >= result.shape[1]:
            return store(result)
        result = np.ascontiguousarray(result, dtype=np.float32)
        result[:, :n] = store(result[:, :n])
        return result

    return run


def _active_rows_only(fn: Callable, store: Callable, shape: tuple[int, ...], rows: list[bool],
                      active: list[int | None]) -> Callable[..., np.ndarray]:
    """A row-local step that, while `active[0]` rows are real, computes and stores only those (operands
    flagged in `rows` are cut to them) into a zeroed result of the full shape."""

    def run(attrs: dict[str, Any], *xs: np.ndarray) -> np.ndarray:
        n = active[0]
        if n is None or n >= shape[1]:
            return store(fn(attrs, *xs))
        return on_real_rows(lambda *cut: store(fn(attrs, *cut)), xs, rows, shape, n)

    return run


def _with_weight(weight: np.ndarray) -> Callable[..., np.ndarray]:
    """A16MatMul over an already dequantized weight: what the kernel computes, minus the dequantization
    (the same arithmetic on the same values, so the same bits)."""

    def a16(attrs: dict[str, Any], x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        return plus_bias(attrs, tiled_product(attrs, x, weight), bias)

    return a16


class HostExecutor:
    """Runs programs on host arrays. Same interface as `Device` for what the runtime loop needs."""

    def __init__(
        self, weights: memoryview | bytes | WeightImage, weight_region: tuple[int, int],
        kv_slots: Iterable[TensorDesc] = (), extra_rows: int = 0, cache_bytes: int | None = None,
    ):
        """`weights`: the weight region's bytes from its base (the binary's memory-mapped section), or a
        WeightImage (the build's checks read one layer's weight file)."""
        self.image = weights if isinstance(weights, WeightImage) else FlatImage(weights, weight_region[0])
        self.weight_region = weight_region
        self.cache_bytes = _cache_budget(weight_region[1]) if cache_bytes is None else cache_bytes
        self.cached_bytes = 0
        # 16 bits a weight are kept instead of float32 (twice as many fit; a 1.5B w4 model whole in 3 GiB):
        # whenever the compiled product kernels read them as stored (a decode step then reads half the bytes:
        # numerics/vector_product.py, matrix_product.py), and without them when the loader finds that the
        # model's weights decoded to float32 would not fit the cache.
        self.half = vector_product.kernel("bf16") is not None
        self.buffers: dict[int, np.ndarray] = {}  # address -> the value last stored there
        self._weights: dict[tuple[int, str, tuple[int, ...]], np.ndarray | StoredTensor] = {}
        self._dequantized: dict[int, np.ndarray | None] = {}
        self._zero_points: dict[int, np.ndarray] = {}
        self._programs: dict[int, _HostProgram] = {}
        self._inputs: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}  # large inputs as stored (_stored_input)
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

    def raw(self, t: TensorDesc) -> np.ndarray:
        nbytes, dt = STORAGE[t.dtype]
        return self.image.view(t.address, nbytes * _count(t.shape)).view(dt).reshape(t.shape)

    def stored(self, t: TensorDesc) -> StoredTensor:
        """`t` left in the image, read by rows as kernels use it."""
        return StoredTensor(self.image.array(t.address, STORAGE[t.dtype][1], t.shape), t.dtype)

    def _reserve(self, nbytes: int) -> bool:
        """Room for a decoded copy of `nbytes`? (always, for small ones)"""
        if nbytes > ALWAYS_DECODED_BYTES and self.cached_bytes + nbytes > self.cache_bytes:
            return False
        self.cached_bytes += nbytes
        return True

    def weight(self, t: TensorDesc, gathered: bool = False) -> np.ndarray | StoredTensor:
        """Decoded (float32, or bytes as they are) while the cache has room; in `half` mode, 16-bit weights
        are kept as stored (2 bytes each), which the product kernels read as they are; beyond the cache, a
        StoredTensor read from the file a block of rows at a time. `gathered`: a table only looked up by rows
        (an embedding), which a decoded copy would not speed up: left in the image unless a product keeps it
        (a tied lm_head)."""
        key = (t.address, t.dtype, t.shape)
        cached = self._weights.get(key)
        if cached is None and gathered and _count(t.shape) * 4 > ALWAYS_DECODED_BYTES:
            return self.stored(t)
        if cached is None:
            count = _count(t.shape)
            if t.dtype == "u8" and self._reserve(count):  # levels stay bytes
                cached = self._decoded(t)
            elif self.half and t.dtype in ("bf16", "f16") and count * 4 > ALWAYS_DECODED_BYTES:
                if self._reserve(2 * count):
                    raw = self.raw(t)  # a file image's read is the process's own copy; a mapped image's is not
                    cached = StoredTensor(raw if self.image.reads_copy else raw.copy(), t.dtype)
                else:
                    cached = self.stored(t)
            elif t.dtype != "u8" and self._reserve(4 * count):
                cached = self._decoded(t)
            else:
                cached = self.stored(t)
            self._weights[key] = cached
        return cached

    def levels(self, t: TensorDesc) -> StoredTensor:
        """A quantized product's levels, read by rows as stored: where the image is read from a file (the
        binary), a copy in memory while the cache has room (a decode step reads every level, and from the
        file that is a read system call's copy of each byte every token), else read from the file; a
        memory-mapped image's own bytes."""
        key = (t.address, t.dtype, t.shape)
        cached = self._weights.get(key)
        if not isinstance(cached, StoredTensor):
            copy = self.image.reads_copy and self._reserve(_count(t.shape))
            cached = StoredTensor(self._decoded(t), t.dtype) if copy else self.stored(t)
            self._weights[key] = cached
        return cached

    def zero_points(self, t: TensorDesc) -> np.ndarray:
        """A quantized product's zero points as float32, decoded once (exact: they are small integers), so
        that no product converts them again."""
        cached = self._zero_points.get(t.address)
        if cached is None:
            cached = np.ascontiguousarray(decode(self.raw(t), t.dtype), dtype=np.float32)
            cached.flags.writeable = False
            self._zero_points[t.address] = cached
        return cached

    def _decoded(self, t: TensorDesc) -> np.ndarray:
        value = np.ascontiguousarray(decode(self.raw(t), t.dtype))
        value.flags.writeable = False
        return value

    @staticmethod
    def decodes_from_levels(weight: TensorDesc, scale: TensorDesc, attrs: dict[str, Any]) -> bool:
        """Whether a one-row product over this quantized weight runs from its levels as stored (as the
        kernels' DequantizedRows decides it: levels_product.takes)."""
        cols = weight.shape[1] * (2 if attrs.get("packed") else 1)
        return levels_product.takes(attrs, cols, compute_dtype(scale.dtype))

    def dequantized(self, weight: TensorDesc, scale: TensorDesc, zp: TensorDesc,
                    attrs: dict[str, Any]) -> np.ndarray | StoredTensor | None:
        """An A16MatMul's weight dequantized once, if the cache has room (in `half` mode as bf16 bits: the
        dequantized values are exact in bf16, so nothing is lost, and the product kernels read them as they
        are); None: the products read the levels a block of rows at a time."""
        if weight.address not in self._dequantized:
            rows, cols = weight.shape[0], weight.shape[1] * (2 if attrs.get("packed") else 1)
            scale_type = compute_dtype(scale.dtype)
            half = self.half and attrs.get("dequant_dtype") == "bf16" and scale_type == np.float32
            w: np.ndarray | StoredTensor | None = None
            # A weight the compiled dequantizer takes is never kept dequantized: dequantizing it from its
            # levels as a product reads it costs no more than reading a kept 16-bit copy (docs/performance.md,
            # its history in git), and the levels take a quarter of that memory.
            compiled = compiled_dequant.wanted(rows * cols, attrs, scale_type)
            if not compiled and self._reserve((2 if half else 4) * rows * cols):
                raw = (self.raw(weight), decode(self.raw(scale), scale.dtype), self.raw(zp))
                if half:  # rounded to bf16 by the dequantizer: the top half of each float is the value
                    w = StoredTensor(dequantize_bf16_bits(attrs, *raw), "bf16")
                else:
                    full = dequantize_uncached(attrs, *raw).astype(np.float32, copy=False)
                    full.flags.writeable = False
                    w = full
            self._dequantized[weight.address] = w
        return self._dequantized[weight.address]

    def release_weights(self) -> None:
        """Done with this executor (a check job moving to its next layer): its dequantized weights go back to
        the buffer pool for the next layer's, and nothing here reads them again."""
        self._programs.clear()
        buffer_pool.give_back(self._dequantized.values())
        self._dequantized.clear()
        self._zero_points.clear()
        self._weights.clear()
        self.cached_bytes = 0  # nothing decoded is held any more

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

    def load(self, prog: Program) -> None:
        """Bind `prog` and read its weights now, as a model load does, rather than on its first run."""
        self._program(prog).load_weights()

    def set_input(self, prog: Program, name: str, value: np.ndarray) -> None:
        for n, t in prog.inputs:
            if n == name:
                self.buffers[prog.tensors[t].address] = self._stored_input(value, prog.tensors[t])
                return
        raise KeyError(f"{prog.net} has no input {name}")

    def _stored_input(self, value: np.ndarray, desc: TensorDesc) -> np.ndarray:
        """`value` rounded to the input's element type. A large one given again (a prefill's mask, the same
        array for every layer: 4M values a layer at 2048 rows) is rounded once; the copy is read-only, and the
        runtime never changes an array it has given as an input."""
        key = (id(value), desc.dtype, desc.shape)
        seen = self._inputs.get(key)
        if seen is not None and seen[0] is value:
            return seen[1]
        shaped = np.asarray(value).reshape(desc.shape)
        # bf16 (a decode step's mask and hidden states, every layer): the compiled store, one pass.
        stored = (compiled_round.rounded_bf16(shaped) if desc.dtype == "bf16"
                  else np.ascontiguousarray(round_to(shaped, desc.dtype)))
        if stored.size >= LARGE_INPUT:
            stored.flags.writeable = False
            if len(self._inputs) >= 4:
                self._inputs.clear()
            self._inputs[key] = (value, stored)
        return stored

    def run(self, prog: Program, trace: Callable[[str, np.ndarray], None] | None = None,
            active_rows: int | None = None) -> None:
        """`active_rows`: only the first rows (tokens) of a prefill hold real tokens; products compute those
        rows and attention the row tiles holding them (the same bits there), zeros after them."""
        hp = self._program(prog)
        # The caller holds np.errstate once per token (CompiledModel), not once per net. Attention's products
        # run their tiles on threads, one BLAS thread each (numerics/parallel.py); no weight product is BLAS's.
        with one_thread():
            hp.run(active_rows, keep=trace is not None)
        if trace is not None:
            for ins, value in zip(prog.instrs, hp.vals, strict=True):
                trace(ins.loc, value)
        for address, get in hp.outputs:
            self.buffers[address] = get()
        # Only the outputs live on (in `buffers`): a 28-layer model's prefill intermediates would otherwise
        # stay allocated, every net's, until that net runs again.
        hp.vals[:] = [None] * len(hp.vals)

    def get_output(self, prog: Program, name: str) -> np.ndarray:
        desc = self._program(prog).output_descs.get(name)
        if desc is None:
            raise KeyError(f"{prog.net} has no output {name}")
        return _fit(self.buffers[desc.address], desc.shape)

    def set_output(self, prog: Program, name: str, value: np.ndarray) -> None:
        """Overwrite an output of the program last run, rounded to its element type as a store would."""
        desc = self._program(prog).output_descs.get(name)
        if desc is None:
            raise KeyError(f"{prog.net} has no output {name}")
        self.buffers[desc.address] = np.ascontiguousarray(round_to(np.asarray(value).reshape(desc.shape), desc.dtype))

    def copy_rows(self, src: TensorDesc, dst: TensorDesc, at: int, rows: int) -> None:
        """Rows [0, rows) of the buffer at `src` into rows [at, at+rows) of the cache at `dst` (axis 1)."""
        new = _fit(self.buffers[src.address], src.shape)
        cache = self.buffers.get(dst.address)
        if cache is None or cache.shape != dst.shape:
            cache = self.buffers[dst.address] = np.zeros(dst.shape, dtype=np.float32)
        cache[0, at : at + rows] = new[0, :rows]


    def shift_rows(self, src: TensorDesc, dst: TensorDesc, rows: int) -> None:
        """The buffer at `dst` becomes its last dst.shape[1] rows (axis 1) after rows [0, rows) of the buffer
        at `src` are appended: a convolution's window moved over a net's new rows."""
        new = _fit(self.buffers[src.address], src.shape)[:, :rows]
        window = _fit(self.buffers[dst.address], dst.shape)
        joined = np.concatenate([window, new], axis=1)
        self.buffers[dst.address] = np.ascontiguousarray(joined[:, joined.shape[1] - dst.shape[1] :])

    def clear(self, dst: TensorDesc) -> None:
        self.buffers[dst.address] = np.zeros(dst.shape, dtype=np.float32)

    def read(self, t: TensorDesc) -> np.ndarray:
        """The value last stored in the buffer at `t` (a cache or a state)."""
        return _fit(self.buffers[t.address], t.shape)


def _cache_budget(weight_bytes: int) -> int:
    """LLMBUILD_HOST_CACHE_MB, else DEFAULT_CACHE_BYTES or the `weight_bytes` of the binary's weight region,
    whichever is larger."""
    import os

    value = os.environ.get("LLMBUILD_HOST_CACHE_MB", "").strip()
    return int(value) << 20 if value.isdigit() else max(DEFAULT_CACHE_BYTES, weight_bytes)

"""A simulated device: a global-memory byte array, a local memory of the chip's size, and programs that
read and write them by address.

A program runs as the chip runs it, by its layer groups (`local_memory.py`): Load and Store commands move
bytes between global and local memory at the program's addresses, and every compute command reads and
writes local memory only. This is the device's one execution path; the op list alone is the host's
(runtime/host.py) and the interpreter's. A wrong address or an overlap of live buffers gives wrong
numbers, as on the chip; writes into the weight region, accesses past the end of either memory and
overlaps of live local buffers are faults.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.binary.program import Program, TensorDesc
from llmbuild.numerics.formats import STORAGE, decode, encode
from llmbuild.numerics.parallel import one_thread
from llmbuild.numerics.stored import StoredTensor
from llmbuild.runtime.faults import DeviceFault
from llmbuild.runtime.local_memory import run_groups
from llmbuild.runtime.weight_image import FlatImage, WeightImage

Trace = Callable[[str, np.ndarray], None]
LAZY_WEIGHT_BYTES = 64 << 20  # weights larger than this once decoded stay in their storage format


class Device:
    def __init__(self, size: int, weight_region: tuple[int, int] = (0, 0), lmem_bytes: int | None = None,
                 weights: memoryview | bytes | WeightImage | None = None):
        """`lmem_bytes`: the chip's local memory; None takes what each program was planned for. `weights`:
        the weight region's bytes (the binary's memory-mapped section), read in place instead of copied
        into device memory: a 7B image is not duplicated in host memory."""
        # np.zeros maps pages lazily: untouched regions cost no host memory.
        self.mem = np.zeros(size, dtype=np.uint8)
        self.weight_region = weight_region
        self.lmem_bytes = lmem_bytes
        self._weights = weights if weights is None or isinstance(weights, WeightImage) else FlatImage(
            weights, weight_region[0])
        self._lmem: np.ndarray | None = None
        self._weight_cache: dict[tuple[int, str, tuple[int, ...]], np.ndarray] = {}

    def _raw(self, t: TensorDesc) -> np.ndarray:
        nbytes, dt = STORAGE[t.dtype]
        count = int(np.prod(t.shape)) if t.shape else 1
        end = t.address + count * nbytes
        if t.address < 0 or end > self.mem.size:
            raise DeviceFault(f"access {t.address:#x}..{end:#x} outside device memory ({self.mem.size:#x})")
        if self._weights is not None and self._in_weights(t):
            try:
                return self._weights.view(t.address, end - t.address).view(dt).reshape(t.shape)
            except LlmbuildError as exc:
                raise DeviceFault(f"access {t.address:#x}..{end:#x}: {exc}") from None
        return self.mem[t.address : end].view(dt).reshape(t.shape)

    def _in_weights(self, t: TensorDesc) -> bool:
        lo, size = self.weight_region
        return lo <= t.address < lo + size

    def read(self, t: TensorDesc) -> np.ndarray | StoredTensor:
        if self._in_weights(t):
            key = (t.address, t.dtype, t.shape)
            cached = self._weight_cache.get(key)
            if cached is None:
                raw = self._raw(t)
                if raw.nbytes * 4 // STORAGE[t.dtype][0] > LAZY_WEIGHT_BYTES:
                    # a vocabulary table: gathers and streamed products read only the rows they need
                    cached = StoredTensor(raw, t.dtype)
                else:
                    cached = decode(raw, t.dtype)
                    cached.flags.writeable = False  # weights are read-only; kernels may cache what they derive
                self._weight_cache[key] = cached
            return cached
        return decode(self._raw(t), t.dtype)

    def check_writable(self, t: TensorDesc) -> None:
        lo, size = self.weight_region
        nbytes = STORAGE[t.dtype][0] * (int(np.prod(t.shape)) if t.shape else 1)
        if t.address < lo + size and t.address + nbytes > lo:
            raise DeviceFault(f"write to {t.address:#x} hits the read-only weight region")

    def write(self, t: TensorDesc, value: np.ndarray) -> None:
        self.check_writable(t)
        value = np.asarray(value)
        if value.shape != t.shape:
            value = value.reshape(t.shape)
        self._raw(t)[...] = encode(value, t.dtype)

    def load_bytes(self, address: int, data: bytes | memoryview) -> None:
        self.mem[address : address + len(data)] = np.frombuffer(data, dtype=np.uint8)
        self._weight_cache.clear()

    def local_memory(self, prog: Program) -> np.ndarray:
        size = self.lmem_bytes if self.lmem_bytes is not None else prog.lmem_bytes
        if self._lmem is None or self._lmem.size != size:
            self._lmem = np.zeros(size, dtype=np.uint8)
        return self._lmem

    def run(self, prog: Program, trace: Trace | None = None, active_rows: int | None = None) -> None:
        """`active_rows`: the real tokens of a prefill the caller checks; row-tiled groups run the tiles
        holding them (at least two) instead of all (local_memory.run_groups)."""
        if prog.instrs and not prog.groups:
            raise LlmbuildError(f"{prog.net}: the program has no layer groups: the device runs only what the "
                                f"layer-group pass made (codegen/groups.py)")
        # BLAS on one thread: matrix products then give the same bits on any machine's thread count (their
        # tiles run side by side instead: numerics/parallel.py); one-row products are not BLAS's
        # (numerics/vector_product.py).
        with one_thread(), np.errstate(over="ignore", under="ignore"):
            run_groups(self, prog, self.local_memory(prog), trace, active_rows)

    def set_input(self, prog: Program, name: str, value: np.ndarray) -> None:
        for n, t in prog.inputs:
            if n == name:
                self.write(prog.tensors[t], value)
                return
        raise KeyError(f"{prog.net} has no input {name}")

    def get_output(self, prog: Program, name: str) -> np.ndarray:
        for n, t in prog.outputs:
            if n == name:
                return self.read(prog.tensors[t]).copy()
        raise KeyError(f"{prog.net} has no output {name}")

    def set_output(self, prog: Program, name: str, value: np.ndarray) -> None:
        """Overwrite an output of the program last run (the runtime puts image features into embeddings)."""
        for n, t in prog.outputs:
            if n == name:
                self.write(prog.tensors[t], value)
                return
        raise KeyError(f"{prog.net} has no output {name}")

    def copy_rows(self, src: TensorDesc, dst: TensorDesc, at: int, rows: int) -> None:
        """Rows [0, rows) of `src` into rows [at, at+rows) of `dst` (axis 1), as stored bytes: how the
        runtime appends a net's new k/v rows to a layer's cache."""
        self._raw(dst)[0, at : at + rows] = self._raw(src)[0, :rows]

    def shift_rows(self, src: TensorDesc, dst: TensorDesc, rows: int) -> None:
        """`dst` becomes the last dst.shape[1] rows (axis 1) of its own rows followed by rows [0, rows) of
        `src`, as stored bytes: how the runtime moves a convolution's window over a net's new rows."""
        window = self._raw(dst)
        joined = np.concatenate([window, self._raw(src)[:, :rows]], axis=1)
        window[...] = joined[:, joined.shape[1] - window.shape[1] :]

    def clear(self, dst: TensorDesc) -> None:
        """`dst` all zeros (a state before the first token)."""
        self.check_writable(dst)
        self._raw(dst)[...] = 0

"""Where an executor finds the bytes of the weight region without holding a copy of it.

The weight region of device memory is read-only, so an executor can read it straight from wherever the
bytes already are: the binary's memory-mapped `weights` section (one flat image from the region's base),
or, in the build's checks, the memory-mapped weight files of one layer or of the head (each tensor at
its planned address, nothing in between). Neither is ever copied whole into host memory.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError


class WeightImage:
    """Read-only bytes of the weight region, by device address."""

    # Whether `view` returns memory of its own (read from a file), not a view of memory held elsewhere.
    reads_copy = False

    def view(self, address: int, nbytes: int) -> np.ndarray:
        """uint8[nbytes] at `address`; a LlmbuildError when no weight lies there."""
        raise NotImplementedError

    def array(self, address: int, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
        """The tensor at `address` as something kernels slice by rows (an ndarray view here)."""
        count = int(np.prod(shape)) if shape else 1
        return self.view(address, count * np.dtype(dtype).itemsize).view(dtype).reshape(shape)


_OPEN_LOCK = threading.Lock()


class FileArray:
    """A tensor in a file, read by rows with plain reads when sliced: what a memory map gives, without
    keeping every page ever read resident in the process (the host path of a 7B binary reads all 5 GB of
    its weights for every token)."""

    def __init__(self, path: Path, offset: int, dtype: np.dtype, shape: tuple[int, ...]):
        self.path, self.offset, self.dtype, self.shape = path, offset, np.dtype(dtype), tuple(shape)
        self.row_bytes = self.dtype.itemsize * int(np.prod(self.shape[1:]))
        self._fd: int | None = None

    def _read(self, start: int, nbytes: int) -> np.ndarray:
        if self._fd is None:
            with _OPEN_LOCK:  # a decode step's threads read blocks of one tensor side by side: open it once
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDONLY)
        data = os.pread(self._fd, nbytes, self.offset + start)
        if len(data) != nbytes:
            raise LlmbuildError(f"{self.path}: truncated (weights end before byte {self.offset + start + nbytes})")
        return np.frombuffer(data, dtype=self.dtype)

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, slice):
            lo, hi, _ = index.indices(self.shape[0])
            return self._read(lo * self.row_bytes, max(0, hi - lo) * self.row_bytes).reshape(-1, *self.shape[1:])
        rows = np.asarray(index, dtype=np.int64)
        flat = [self._read(int(r) * self.row_bytes, self.row_bytes) for r in rows.reshape(-1)]
        out = np.stack(flat) if flat else np.empty((0, *self.shape[1:]), self.dtype)
        return out.reshape(*rows.shape, *self.shape[1:])

    def __del__(self) -> None:
        if self._fd is not None:
            os.close(self._fd)


class FileImage(WeightImage):
    """The weights section of a binary on disk, read with plain reads (not mapped)."""

    reads_copy = True

    def __init__(self, path: Path, offset: int, size: int, base: int = 0):
        self.path, self.offset, self.size, self.base = Path(path), offset, size, base

    def _check(self, address: int, nbytes: int) -> int:
        lo = address - self.base
        if lo < 0 or lo + nbytes > self.size:
            raise LlmbuildError(f"weight {address:#x}..{address + nbytes:#x} outside the weight image "
                                f"{self.base:#x}..{self.base + self.size:#x}")
        return lo

    def view(self, address: int, nbytes: int) -> np.ndarray:
        lo = self._check(address, nbytes)
        return FileArray(self.path, self.offset + lo, np.uint8, (nbytes,))[:]

    def array(self, address: int, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
        count = int(np.prod(shape)) if shape else 1
        lo = self._check(address, count * np.dtype(dtype).itemsize)
        return FileArray(self.path, self.offset + lo, dtype, shape)


class FlatImage(WeightImage):
    """One contiguous image starting at device address `base` (a binary's weights section)."""

    def __init__(self, data: memoryview | bytes | np.ndarray, base: int = 0):
        self.bytes = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
        self.base = base

    def view(self, address: int, nbytes: int) -> np.ndarray:
        lo = address - self.base
        if lo < 0 or lo + nbytes > self.bytes.size:
            raise LlmbuildError(f"weight {address:#x}..{address + nbytes:#x} outside the weight image "
                                f"{self.base:#x}..{self.base + self.bytes.size:#x}")
        return self.bytes[lo : lo + nbytes]


class SlotImage(WeightImage):
    """Separate tensors, each at its own device address (the build's per-layer weight files)."""

    def __init__(self, tensors: Mapping[int, np.ndarray]):
        self._starts = sorted(tensors)
        self._data = [np.frombuffer(tensors[a], dtype=np.uint8) if not isinstance(tensors[a], np.ndarray)
                      else tensors[a].reshape(-1).view(np.uint8) for a in self._starts]

    def view(self, address: int, nbytes: int) -> np.ndarray:
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0:
            lo = address - self._starts[i]
            data = self._data[i]
            if lo + nbytes <= data.size:
                return data[lo : lo + nbytes]
        raise LlmbuildError(f"weight {address:#x}..{address + nbytes:#x} is not in this image's tensors")

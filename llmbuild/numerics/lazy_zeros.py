"""Zeroed arrays whose pages the kernel maps only when they are written.

A prefill of a few real tokens in a static net of 2048 rows makes, for every op, a result of all 2048 rows:
the real rows computed, zeros after them. numpy's `zeros` asks the C library for zeroed memory, and under
the heap-only allocator settings of the reference and end-to-end steps (allocator.py) the C
library must then write every zero itself: a 1.5B layer's MLP result is 73 MB, of which 15 rows are used.
That memset was a fifth of the end-to-end check's time (perf, the 1.5B at seq 2048). A large array here is
an anonymous mapping instead, which the kernel fills with zero pages on first touch: the padding rows,
never written, cost nothing.
"""

from __future__ import annotations

import math
import mmap

import numpy as np

LAZY_MIN_BYTES = 1 << 20  # below this, numpy's own zeros (a mapping costs two system calls)


def zeros(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """`np.zeros(shape, dtype)`, with untouched pages left unmapped for large arrays. The mapping is released
    when the last array that views it is freed."""
    dt = np.dtype(dtype)
    nbytes = dt.itemsize * math.prod(shape)  # np.prod would make an array of the shape first
    if nbytes < LAZY_MIN_BYTES:
        return np.zeros(shape, dtype=dt)
    # Private: Python's default for an anonymous map is shared memory, which faults in through shmem.
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(mapping, dtype=dt).reshape(shape)

"""The allocators' settings for a process that allocates and frees large arrays in a loop.

glibc hands every block above its mmap threshold (128 KiB, adapted upward as blocks are freed, at most
32 MiB) to a fresh mapping and unmaps it when freed, so each of the thousands of layer-sized temporaries a
build step makes (a 1.5B MLP weight in float32 is 55 MB) is paid again in page faults, and numpy asks for
transparent huge pages on large arrays, so each fault also zeroes 2 MiB: on these machines a fault costs tens
of microseconds, and zeroing pages was 22% of an end-to-end check's time (perf, the 1.5B at seq 2048).
Taking every block from the heap (no mmap) and keeping freed heap (a high trim threshold) lets the next
temporary reuse the pages the last one left. torch's own CPU allocator is told to align large tensors to
huge pages (THP_MEM_ALLOC_ENABLE, read when torch loads), so what it does fault in comes 2 MiB at a time.

Measured on the 1.5B at seq 2048, one job at a time (/usr/bin/time -v, this 2-core machine):
reference 38.0 s -> 28.8 s wall, 14.1 -> 6.3 s in the kernel, 4.6 M -> 0.77 M page faults, peak resident
2.66 -> 2.39 GB; e2e 25.5 s -> 23.6 s, 11.1 -> 7.2 s in the kernel, peak 3.51 -> 3.80 GB (freed blocks stay
in the heap). The benchmarks in docs/performance.md give every rule's declared and measured memory.
"""

from __future__ import annotations

import ctypes
import os

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
_TRIM_THRESHOLD = 1 << 30


def reuse_freed_memory() -> bool:
    """Apply the settings; False where the C library has no mallopt (not glibc: only torch's setting then)."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # before torch is imported; a user's setting wins
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library already loaded into this process
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(option, value) for option, value in (
        (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX), (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD), (_M_MMAP_MAX, 0)))


def release_freed_memory() -> None:
    """Give the freed heap back to the system (glibc's malloc_trim): for a step that ends one phase holding
    far less than its peak (the vision step, after its 1.2 GB ONNX model is imported), so that the kept heap
    does not count against the next phase's resident memory. A no-op without glibc."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)

"""The allocators' settings: for every llmbuild process, and more for the steps that free large arrays in a
loop.

Every process (`tune_every_process`, called from `llmbuild/__init__.py` before numpy is imported):
- numpy asks for no transparent huge pages (NUMPY_MADVISE_HUGEPAGE=0). With the kernel's default
  `defrag=madvise`, a fault in an advised array compacts memory to find a free 2 MiB block, and a build
  machine's memory is full of page cache (checkpoints, weight files, the binary): a 1.5B check job spent
  2.2 of its 7.0 s in the kernel with the advice, 0.6 of 5.5 s without; the end-to-end check 4.9 of
  17.4-18.1 s against 2.7-3.4 of 15.9-16.8 s (one thread, two runs each, when chosen); a layer job lost
  0.1 s.
- glibc keeps blocks up to 32 MiB on its heap (its largest mmap threshold) and keeps up to 1 GiB of freed
  heap: numpy's megabyte-sized temporaries were mapped, zeroed and unmapped at every operation. A 1.5B
  check job's kernel time went 1.7-2.0 -> 0.5-1.0 s, its wall time 5.4-5.7 -> 4.2-5.1 s (three runs
  each), for 30 MB more resident memory. Blocks above 32 MiB are still mapped and unmapped, so a large
  array never splits the heap (the heap-only setting below did, on the 7B's checks).
A variable the user set (NUMPY_MADVISE_HUGEPAGE, MALLOC_MMAP_THRESHOLD_ and friends) wins.

The reference and end-to-end steps (`reuse_freed_memory`, from llmbuild/cli.py) go further: glibc hands every
block above its mmap threshold (128 KiB, adapted upward as blocks are freed, at most 32 MiB) to a fresh
mapping and unmaps it when freed, so each of the thousands of layer-sized temporaries a build step makes (a
1.5B MLP weight in float32 is 55 MB) is paid again in page faults, and (before every process turned numpy's
advice off, above) numpy asked for transparent huge pages on large arrays, so each fault also zeroed 2 MiB: on
these machines a fault costs tens of microseconds, and zeroing pages was 22% of an end-to-end check's time
(perf, the 1.5B at seq 2048). Taking every block from the heap (no mmap) and keeping freed heap (a high trim
threshold) lets the next temporary reuse the pages the last one left. torch's own CPU allocator is told to
align large tensors to huge pages (THP_MEM_ALLOC_ENABLE, read when torch loads), so what it does fault in
comes 2 MiB at a time.

Measured on the 1.5B at seq 2048, one job at a time (/usr/bin/time -v, this 2-core machine):
reference 38.0 s -> 28.8 s wall, 14.1 -> 6.3 s in the kernel, 4.6 M -> 0.77 M page faults, peak resident
2.66 -> 2.39 GB; e2e 25.5 s -> 23.6 s, 11.1 -> 7.2 s in the kernel, peak 3.51 -> 3.80 GB (freed blocks stay
in the heap). The benchmarks in docs/performance.md give every rule's declared and measured memory.
"""

from __future__ import annotations

import ctypes
import os
import platform

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
_TRIM_THRESHOLD = 1 << 30
# What every process gets (blocks up to 32 MiB and 1 GiB of freed heap kept); the heap-only steps add to it.
_KEEP_FREED = ((_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX), (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))


def tune_every_process() -> bool:
    """The settings every llmbuild process gets; whether glibc's were applied."""
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")  # read by numpy when it is imported
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")):
        return False
    return _mallopt(*_KEEP_FREED)


def reuse_freed_memory() -> bool:
    """Apply the settings; False where the C library has no mallopt (not glibc: only torch's setting then)."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # before torch is imported; a user's setting wins
    return _mallopt(*_KEEP_FREED, (_M_MMAP_MAX, 0))


def _mallopt(*settings: tuple[int, int]) -> bool:
    """glibc's mallopt(option, value) for each setting; False where the C library has none, or refuses one."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library already loaded into this process
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(option, value) for option, value in settings)


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

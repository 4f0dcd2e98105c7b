"""Memory from the kernel without stalls: freed memory stays in the process (glibc), and numpy does not
ask for transparent huge pages.

glibc serves a large allocation (from 128 KiB, rising with use to 32 MiB) with its own mmap and unmaps it
when it is freed, and it trims the top of the heap as soon as 128 KiB there are free. numpy allocates a
fresh array for nearly every operation, so a step that computes on megabyte-sized activations and weight
tiles maps, zeroes and unmaps the same memory over and over. In the 1.5B build (2026-12-02) the kernel's
time was a quarter of all CPU time (30 of 130 CPU-seconds). Raising the mmap threshold to glibc's largest
and keeping up to 1 GiB of freed memory took a 4-layer check job of that build from 1.7-2.0 to 0.5-1.0
kernel seconds and from 5.4-5.7 to 4.2-5.1 s (three runs each), for 30 MB more resident memory; the
reference went 21.7-21.9 -> 21.2-21.3 s. The arithmetic is unchanged.

numpy advises the kernel to back every array of 4 MiB or more with 2 MiB pages. With the kernel's
default `defrag=madvise`, a fault in such an array compacts memory to find a free 2 MiB block, and a build
machine's memory is full of page cache (checkpoints, weight files, the binary): the 1.5B check job spent
2.2 of its 7.0 s in the kernel with the advice and 0.6 of 5.5 s without it, the end-to-end check 4.9 of
17.4-18.1 s against 2.7-3.4 of 15.9-16.8 s (one thread, two runs each); a layer job lost 0.1 s.
NUMPY_MADVISE_HUGEPAGE=0 turns the advice off; it must be set before numpy is imported.

Set through `mallopt` and the environment when llmbuild is imported (`llmbuild/__init__.py`), so every
build step and `llmbuild run` gets them; a variable the user set (NUMPY_MADVISE_HUGEPAGE, or
MALLOC_MMAP_THRESHOLD_ and friends) wins. Elsewhere than glibc the malloc settings are left alone.
"""

from __future__ import annotations

import ctypes
import os
import platform

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest: allocations above it are still mapped and unmapped
TRIM_THRESHOLD = 1 << 30  # free memory kept at the top of the heap before it is given back


def tune() -> bool:
    """Apply the settings; whether glibc's were applied."""
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")  # read by numpy when it is imported
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    user = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
    if any(name in os.environ for name in user):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))

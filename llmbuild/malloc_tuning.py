"""Keep freed memory in the process instead of handing it back to the kernel at every free (glibc only).

glibc serves a large allocation (from 128 KiB, rising with use to 32 MiB) with its own mmap and unmaps it
when it is freed, and it trims the top of the heap as soon as 128 KiB there are free. numpy allocates a
fresh array for nearly every operation, so a step that computes on megabyte-sized activations and weight
tiles maps, zeroes and unmaps the same memory over and over. In the 1.5B build (2026-12-02) the kernel's
time was a quarter of all CPU time (30 of 130 CPU-seconds). Raising the mmap threshold to glibc's largest
and keeping up to 1 GiB of freed memory took a 4-layer check job of that build from 1.7-2.0 to 0.5-1.0
kernel seconds and from 5.4-5.7 to 4.2-5.1 s (three runs each), for 30 MB more resident memory; the
reference went 21.7-21.9 -> 21.2-21.3 s. The arithmetic is unchanged.

Set through `mallopt` when llmbuild is imported (`llmbuild/__init__.py`), so every build step and
`llmbuild run` gets it; a variable the user set (MALLOC_MMAP_THRESHOLD_ and friends) wins. Elsewhere than
glibc nothing is done.
"""

from __future__ import annotations

import ctypes
import os
import platform

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest: allocations above it are still mapped and unmapped
TRIM_THRESHOLD = 1 << 30  # free memory kept at the top of the heap before it is given back


def tune() -> bool:
    """Apply the settings; whether they were applied."""
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

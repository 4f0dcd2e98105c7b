"""The C allocator's settings for a process that allocates and frees large numpy arrays in a loop.

glibc hands every block above its mmap threshold (128 KiB, adapted upward as blocks are freed) to a fresh
mapping and returns freed heap above 128 KiB to the kernel, so each of the thousands of layer-sized
temporaries a build step makes is paid again in page faults: on these machines a fault costs tens of
microseconds, and a check job spent 40% of its time in the kernel. Raising both thresholds keeps freed
blocks up to 32 MiB (glibc's largest mmap threshold) in the heap for reuse. Measured on a 1.5B layer
shard's check with the same settings given as glibc's environment variables: 6.3 s -> 5.1 s and a third
fewer page faults, peak resident memory 1.30 GB either way (single runs; these shared VMs vary by 20%).
"""

from __future__ import annotations

import ctypes

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
_TRIM_THRESHOLD = 1 << 30


def reuse_freed_memory() -> bool:
    """Apply the settings; False where the C library has no mallopt (not glibc: nothing changes there)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library already loaded into this process
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))

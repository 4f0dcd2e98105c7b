"""One set of BLAS kernels on every x86-64 host: the runtime's arithmetic must not depend on the CPU.

numpy's OpenBLAS chooses its kernels for the CPU it runs on (it is built with DYNAMIC_ARCH): AVX2 ones on
most machines, AVX-512 ones ("SkylakeX") on a Xeon that has them. They sum a dot product in different
orders, so the same product ends in other last bits, and the host path and the simulated device (which
agree bit for bit on one machine) then differ between machines. It shows: SmolLM2-135M's first reply
token to "What is the capital of France?" is a near-tie ("The" 25.33 against "L" 25.24 in transformers),
and the same bf16 binary answered "The capital of France is Paris" with the AVX2 kernels and
"L'Étoile, la Marseillaise..." with the AVX-512 ones (OpenBLAS 0.3.29, seen by setting OPENBLAS_CORETYPE on
an AVX-512 machine; AMD's Zen kernels gave Paris too).

A device has one arithmetic, so llmbuild pins OpenBLAS to its Haswell kernels (AVX2 and FMA: Intel CPUs
from 2013 on, and every AMD Zen) before numpy is imported: `llmbuild/__init__.py` calls `pin()` first,
and every build step and `llmbuild run` is a process that imports llmbuild before numpy. On an AVX-512
machine the price is some prefill speed (decode is not BLAS's: numerics/vector_product.py); the host's
current figures are in docs/performance.md. A user's own OPENBLAS_CORETYPE wins; without AVX2 and FMA, or
off x86-64, nothing is set. Loading a binary warns (`runtime/blas.warn_if_unpinned`) when numpy loaded
other kernels before llmbuild could pin them.
"""

from __future__ import annotations

import os
import platform

PINNED = "Haswell"


def _has_avx2_and_fma() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return {"avx2", "fma"} <= set(line.partition(":")[2].split())
    except OSError:  # not Linux: leave OpenBLAS's choice
        return False
    return False


def pin() -> None:
    """Set OPENBLAS_CORETYPE (unless the user did) for this process and the processes it starts; it takes
    effect where numpy has not loaded OpenBLAS yet."""
    if platform.machine().lower() in ("x86_64", "amd64") and _has_avx2_and_fma():
        os.environ.setdefault("OPENBLAS_CORETYPE", PINNED)

"""OpenBLAS as the runtime finds it: which kernels numpy's copy runs, and a warning when llmbuild's pin
(llmbuild/blas_kernels.py) did not take.

Matrix-matrix products (a prefill's tiles) are OpenBLAS's, each tile on one BLAS thread
(numerics/parallel.py), so their bits depend on its kernels only. One-row products (decode steps, the
lm_head) are not BLAS's at all: numerics/vector_product.py defines and compiles them.

numpy has no API for its BLAS; like threadpoolctl, we call OpenBLAS's own functions in the library numpy
loaded (numerics/parallel.py finds them). Without OpenBLAS (another BLAS, an unusual install) these are
no-ops.
"""

from __future__ import annotations

import ctypes
from functools import cache

from llmbuild.numerics.parallel import openblas_function


def kernel_name() -> str | None:
    """The kernel set numpy's OpenBLAS is using ("Haswell", "SkylakeX", ...; llmbuild/blas_kernels.py pins
    it), or None without OpenBLAS."""
    get = openblas_function("get_corename")
    if get is None:
        return None
    get.restype, get.argtypes = ctypes.c_char_p, []
    return get().decode()


@cache
def warn_if_unpinned() -> None:
    """Warn once when the pin of llmbuild/blas_kernels.py was asked for but did not take (numpy loaded
    OpenBLAS before llmbuild was imported): results may then differ from other hosts' in the last bits."""
    import os
    import warnings

    wanted = os.environ.get("OPENBLAS_CORETYPE")
    found = kernel_name()
    if wanted and found and wanted.lower() not in (found.lower(), "zen"):  # OpenBLAS runs Zen as Haswell
        warnings.warn(f"numpy's OpenBLAS runs its {found} kernels, not {wanted} (numpy was imported before "
                      "llmbuild): the runtime's last bits may differ from other hosts'", RuntimeWarning, stacklevel=3)

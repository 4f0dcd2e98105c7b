"""One BLAS thread while the host path runs matrix-vector products.

A decode step is a few hundred matrix-vector products of some 100 µs each. OpenBLAS hands each one to
its worker threads, which spin and wait for one another; on a VM whose cores are shared with other jobs
(steal time), a product waits for a descheduled worker and decoding becomes 5-10x slower than on one
thread. A matrix-vector product gives the same bits on any number of threads (each output element is one
dot product, computed whole by one thread), so running those on one thread changes only the speed.
Matrix-matrix products (prefill, M = L rows) keep the process's setting (OPENBLAS_NUM_THREADS): their
bits depend on how the threads split the work, and the host path must agree with the simulated device bit
for bit, so both executors follow the same rule.

numpy has no API for its BLAS threads; like threadpoolctl, we call OpenBLAS's own setter in the library
numpy loaded. Without OpenBLAS (another BLAS, an unusual install) this is a no-op.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

from llmbuild.codegen.program import Program


def vector_only(prog: Program) -> bool:
    """Every matrix product of `prog` has a one-row left operand (decode nets, lm_head)."""
    for ins in prog.instrs:
        if ins.op == "MatMul":
            rows = 1
            for d in prog.tensors[ins.operands[0]].shape[:-1]:
                rows *= d
            if rows != 1:
                return False
        elif ins.op == "FAttention" and ins.attrs["mq"] != 1:
            return False
    return True


@cache
def _openblas_threads() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    import numpy

    here = Path(numpy.__file__).parent
    candidates = [*sorted(here.parent.glob("numpy.libs/lib*openblas*.so*")), *sorted(here.glob(".dylibs/*openblas*"))]
    for path in candidates:
        try:
            lib = ctypes.CDLL(str(path))  # the copy numpy already loaded: same handle
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", "")):
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                put.restype, put.argtypes = None, [ctypes.c_int]
                return get, put
    return None


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """BLAS on the calling thread only, for the duration (the previous setting comes back)."""
    found = _openblas_threads()
    if found is None:
        yield
        return
    get, put = found
    before = get()
    if before == 1:
        yield
        return
    put(1)
    try:
        yield
    finally:
        put(before)

"""Run the independent parts of a product on a few threads, with the same bits on any number.

BLAS's own threads split a product in ways that depend on how many there are, and with them the order of
the sums inside each block kernel: the same prefill gave other logits on 1 and on 2 threads, enough to
flip a near-tie between two tokens (SmolLM2-135M's first reply token to "What is the capital of
France?"). A device has one arithmetic, so the runtime must too. Its executors therefore run BLAS on one
thread (`one_thread`, below) and get their parallelism here instead: attention's products are cut into
tiles whose sizes do not depend on the thread count, each tile one single-threaded BLAS call, run side by
side (`tile_map`; numpy releases the GIL inside BLAS); the compiled products with a weight split their
output rows into spans, each row one thread's (`row_spans`). The result is the same whatever `workers` is.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from llmbuild.numerics import team

T = TypeVar("T")
R = TypeVar("R")

TILE_THREAD_PREFIX = "llmbuild-tile"
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def workers() -> int:
    """Threads to use: the process's BLAS setting when one is given (Snakemake sets it per job), else the
    CPUs this process may run on."""
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return _usable_cpus()


@cache
def _usable_cpus() -> int:
    """The CPUs this process may run on, asked once: every product asks `workers()`, and the system call
    was 7% of a SmolLM2 decode step."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def tile_map(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """`[fn(i) for i in items]`, on up to `workers()` threads when there is more than one item."""
    global _pool, _pool_size
    todo = list(items)
    if len(todo) <= 1:  # before asking the environment for workers: a decode step's attention, every layer
        return [fn(i) for i in todo]
    n = min(workers(), len(todo))
    if n <= 1:
        return [fn(i) for i in todo]
    if _pool is None or _pool_size < n:
        if _pool is not None:
            _pool.shutdown(wait=False)
        _pool, _pool_size = ThreadPoolExecutor(n, thread_name_prefix=TILE_THREAD_PREFIX), n
    return list(_pool.map(fn, todo))


def row_spans(n: int, work: int, threshold: int, run: Callable[[int, int], None],
              native: tuple[int | None, Sequence[int]] | None = None) -> None:
    """`run(lo, hi)` over contiguous spans covering rows [0, n): one span when `work` is below `threshold`
    (a thread hand-off would cost more than the second core saves), on a tile thread (the pool would wait
    on itself) or when a worker would get fewer than two rows; else one span per worker. Each row is one
    span's, whole, so a product whose outputs are per row gets the same bits either way. `native`: the
    same work as a compiled kernel's span entry and its other arguments, run by team.py's workers (a
    hand-off of microseconds) when they are available."""
    if work < threshold:  # before asking the environment: most of a small model's decode products
        run(0, n)
        return
    threads = workers()
    if n < 2 * threads or threading.current_thread().name.startswith(TILE_THREAD_PREFIX):
        run(0, n)
        return
    if native is not None and native[0] is not None and team.run(native[0], native[1], n, threads):
        return
    per = -(-n // threads)
    tile_map(lambda lo: run(lo, min(n, lo + per)), range(0, n, per))


@cache
def openblas_function(name: str) -> Any | None:
    """OpenBLAS's function `name` ("get_num_threads", ...) in the copy numpy loaded (the same handle), under
    the names its builds give it (scipy-openblas's 64-bit interface, its 32-bit one, plain OpenBLAS)."""
    import numpy

    here = Path(numpy.__file__).parent
    candidates = [*sorted(here.parent.glob("numpy.libs/lib*openblas*.so*")), *sorted(here.glob(".dylibs/*openblas*"))]
    for path in candidates:
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", "")):
            found = getattr(lib, f"{prefix}_{name}{suffix}", None)
            if found is not None:
                return found
    return None


@cache
def openblas_threads() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    get, put = openblas_function("get_num_threads"), openblas_function("set_num_threads")
    if get is None or put is None:
        return None
    get.restype, get.argtypes = ctypes.c_int, []
    put.restype, put.argtypes = None, [ctypes.c_int]
    return get, put


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """BLAS on the calling thread only, for the duration (the previous setting comes back)."""
    found = openblas_threads()
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

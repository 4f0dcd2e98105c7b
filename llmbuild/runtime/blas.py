"""BLAS threads for matrix-vector products: one, or the process's setting, whichever is faster now.

A decode step is a few hundred matrix-vector products of some 100 µs each, bound by memory bandwidth.
On an idle machine OpenBLAS's worker threads read the weights faster together (13.8 against 10.5 tokens/s
for SmolLM2-135M on 2 cores). But the workers spin and wait for one another: on a VM whose cores are
shared with other jobs (steal time), each product waits for a descheduled worker and decoding becomes
5-10x slower than on one thread. Neither setting is right everywhere, and load changes while a
conversation runs, so `ThreadChoice` times both and keeps the faster, trying the other again now and then.

A matrix-vector product with a multiple of 4 outputs gives the same bits on any number of threads (each
output element is one dot product, computed whole by one thread, and the threads split the outputs at
multiples of 4), so the choice changes only the speed; `vector_only` keeps the others on one thread.
Matrix-matrix products (prefill, M = L rows) keep the process's setting (OPENBLAS_NUM_THREADS): their
bits depend on how the threads split the work, and the host path must agree with the simulated device bit for bit.

numpy has no API for its BLAS threads; like threadpoolctl, we call OpenBLAS's own setter in the library
numpy loaded. Without OpenBLAS (another BLAS, an unusual install) this is a no-op.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache

from llmbuild.binary.program import Program
from llmbuild.numerics.parallel import one_thread, openblas_function, openblas_threads


def vector_only(prog: Program) -> bool:
    """Every matrix product of `prog` has a one-row left operand (decode nets, lm_head) and a multiple of
    4 outputs. OpenBLAS's matrix-vector kernel takes outputs four at a time and the last n % 4 by another
    path, and its threads split the outputs: with n % 4 != 0 one and two threads gave different bits
    (measured, OpenBLAS 0.3.29, n = 4097-4099), so such a program stays on one thread."""
    for ins in prog.instrs:
        if ins.op in ("MatMul", "A16MatMul"):
            rows = 1
            for d in prog.tensors[ins.operands[0]].shape[:-1]:
                rows *= d
            if rows != 1 or prog.tensors[ins.result].shape[-1] % 4:
                return False
        elif ins.op == "FAttention" and ins.attrs["mq"] != 1:
            return False
    return True


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


@dataclass
class _Arms:
    seconds: dict[int, float] = field(default_factory=dict)  # threads (1, or 0: the process's) -> EMA of a run
    best: int = 1
    runs: int = 0
    explore_every: int = 8


class ThreadChoice:
    """Runs each kind of matrix-vector program on one BLAS thread or on the process's setting, whichever
    has been faster for it. When the setting in use slows down the other takes over at once; the other is
    retried after 8 runs, then after twice as many each time it loses (at most every 1024 runs), so a
    machine that became idle is noticed too, without paying often for the retries."""

    ALPHA = 0.3  # weight of a new time in the moving average
    MAX_EXPLORE = 1024

    def __init__(self) -> None:
        found = openblas_threads()
        self._many = found is not None and found[0]() > 1  # is there a choice at all?
        self._arms: dict[str, _Arms] = {}

    @contextlib.contextmanager
    def run(self, kind: str) -> Iterator[None]:
        if not self._many:
            yield
            return
        arms = self._arms.setdefault(kind, _Arms())
        arms.runs += 1
        if len(arms.seconds) < 2:
            threads = 1 if 1 not in arms.seconds else 0
        elif arms.runs % arms.explore_every == 0:
            threads = 1 - arms.best
        else:
            threads = arms.best
        start = time.perf_counter()
        with one_thread() if threads == 1 else contextlib.nullcontext():
            yield
        self._record(arms, threads, time.perf_counter() - start)

    def _record(self, arms: _Arms, threads: int, seconds: float) -> None:
        old = arms.seconds.get(threads)
        explored = threads != arms.best
        # The setting in use is timed every run: a moving average. A retried one was last timed long ago:
        # its new time replaces the old.
        arms.seconds[threads] = seconds if old is None or explored else old + self.ALPHA * (seconds - old)
        if len(arms.seconds) < 2:
            return
        best = min(arms.seconds, key=arms.seconds.__getitem__)
        if explored:
            arms.explore_every = 8 if best != arms.best else min(arms.explore_every * 2, self.MAX_EXPLORE)
        arms.best = best

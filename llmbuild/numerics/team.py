"""Worker threads that wait in compiled code, so that a product's rows can be split over the cores for a few
microseconds instead of a Python thread hand-off's hundred.

A decode step of a small model is hundreds of products of a fraction of a millisecond each (SmolLM2-135M:
a 1536 x 576 bf16 projection reads its 1.8 MB in 0.17 ms on one core). Handing half of one to a
`ThreadPoolExecutor` thread costs more than it saves (a future, a queue, a condition variable, the GIL
twice: 0.24 ms for that projection on two threads against 0.17 ms on one), so numerics/parallel.py ran
every product below 4M weights on one thread, and a decode step used one core of two.

Here each worker is a Python thread that calls, once, a compiled loop (`team_worker`, LLVM IR compiled with
llvmlite like the kernels): ctypes releases the GIL for the call, and the thread never comes back to Python.
It polls its slot for a new job (a generation counter), runs it, publishes that it is done, and after
SPINS polls without a job sleeps in the kernel (futex) until `team_run` wakes it. `team_run`, also called
through ctypes, writes one span of rows into each worker's slot, runs the first span itself, then waits
for the workers' generations. A job is a kernel's span entry (`span_ir`): the kernel's own function with
its arguments read from an array, so the arithmetic is the kernel's and every row is one thread's, whole:
the same bits as one thread (tests/test_team.py).

Linux on x86-64 only (the futex system call's number); elsewhere, and where llvmlite cannot build it, the
thread pool runs the spans as before. One product at a time uses the team (a second caller, another Python
thread, gets the pool). A forked child starts a team of its own when it first needs one.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, TypeVar

import numpy as np

from llmbuild.numerics import llvm_kernels
from llmbuild.numerics.addresses import address

Key = TypeVar("Key")

# Polls (each a `pause`, some 30-150 cycles) before an idle worker sleeps: about 0.1-0.5 ms, longer than
# the Python work between two products of a decode step, far shorter than a pause between tokens.
SPINS = 1 << 13
_SLOT_WORDS = 16  # i64 words per worker slot: 128 bytes, two cache lines, so workers share none
_MAX_WORKERS = 64
# Slot fields (i64 words; the two futex words are the low halves of theirs, little-endian)
_GEN, _DONE, _SLEEPING, _FN, _ARGS, _LO, _HI = range(7)
_SYS_FUTEX, _SYS_SCHED_YIELD = 202, 24  # x86-64 Linux
_FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 128, 129


def available() -> bool:
    """Whether the team can run here (Linux on x86-64, llvmlite able to build it)."""
    return _KERNELS.get("run") is not None


def run(span: int, args: Sequence[int], n: int, threads: int) -> bool:
    """Rows [0, n) of the job `span` (a kernel's span entry, its address) with `args` (its other arguments,
    as i64) on `threads` threads: the caller's and threads - 1 workers'. False, having run nothing, when
    the team cannot (not built here, or busy with another caller's product)."""
    dispatch = _KERNELS.get("run")
    if dispatch is None or threads < 2 or not _lock.acquire(blocking=False):
        return False
    try:
        workers = min(threads - 1, _MAX_WORKERS)
        team = _team(workers)
        packed = np.asarray(args, dtype=np.int64)
        dispatch(address(team.slots), workers, span, address(packed), n, _syscall_address())
    finally:
        _lock.release()
    return True


def span_ir(kernel: str, params: Sequence[str], lo: int) -> str:
    """LLVM IR of `{kernel}_span(ptr args, i64 lo, i64 hi)`: calls `kernel`, whose parameter types are
    `params` ("ptr" or "i64", lo and hi included), with lo and hi at positions `lo` and `lo + 1` and every
    other parameter read in order from the i64 array `args`."""
    lines, call, word = [], [], 0
    for i, kind in enumerate(params):
        if i in (lo, lo + 1):
            call.append(f"i64 %{'lo' if i == lo else 'hi'}")
            continue
        lines += [f"  %p{i}a = getelementptr i64, ptr %args, i64 {word}", f"  %p{i}v = load i64, ptr %p{i}a, align 8"]
        if kind == "ptr":
            lines.append(f"  %p{i} = inttoptr i64 %p{i}v to ptr")
            call.append(f"ptr %p{i}")
        else:
            call.append(f"i64 %p{i}v")
        word += 1
    body = "\n".join(lines)
    return f"""
define void @{kernel}_span(ptr %args, i64 %lo, i64 %hi) {{
entry:
{body}
  call void @{kernel}({", ".join(call)})
  ret void
}}
"""


def signature(params: Sequence[str]) -> Any:
    """The ctypes prototype of a kernel whose parameter types are `params` ("ptr" or "i64")."""
    return ctypes.CFUNCTYPE(None, *(ctypes.c_void_p if kind == "ptr" else ctypes.c_int64 for kind in params))


def with_spans(names: Mapping[Key, str], params: Sequence[str], lo: int) -> tuple[str, dict[Any, str], dict[Any, Any]]:
    """For kernels `names` (key -> symbol) of one prototype: the IR of their span entries, and the symbols
    and signatures for llvm_kernels.compile_functions of the kernels (key) and of their entries
    (("span", key), whose addresses `run` takes)."""
    ir = "".join(span_ir(name, params, lo) for name in names.values())
    symbols: dict[Any, str] = {**names, **{("span", key): f"{name}_span" for key, name in names.items()}}
    prototype = signature(params)
    signatures: dict[Any, Any] = {key: prototype for key in names} | {("span", key): None for key in names}
    return ir, symbols, signatures


# ---- the team ----------------------------------------------------------------------------------------

class _Team:
    """The slots and worker threads of one process (a forked child makes its own)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.slots = np.zeros((_MAX_WORKERS, _SLOT_WORDS), dtype=np.int64)
        self.threads: list[threading.Thread] = []

    def grow(self, workers: int) -> None:
        while len(self.threads) < workers:
            slot = self.slots[len(self.threads)]
            # The slot's generation now, not when the thread gets to read it: a job may be posted before.
            first = int(slot[_GEN]) & 0xFFFFFFFF
            thread = threading.Thread(target=_KERNELS.get("worker"), args=(slot.ctypes.data, _syscall_address(), first),
                                      name=f"llmbuild-team-{len(self.threads)}", daemon=True)
            thread.start()
            self.threads.append(thread)


_lock = threading.Lock()
_current: _Team | None = None


def _team(workers: int) -> _Team:
    """This process's team with at least `workers` workers (the caller holds `_lock`). Workers beyond those
    a run asks for stay asleep: `team_run` uses the first ones."""
    global _current
    if _current is None or _current.pid != os.getpid():
        _current = _Team()  # a forked child's copy has slots but no threads behind them
    _current.grow(workers)
    return _current


@cache
def _syscall_address() -> int:
    """libc's `syscall`, which the compiled code calls for the futex and sched_yield system calls."""
    return ctypes.cast(ctypes.CDLL(None).syscall, ctypes.c_void_p).value or 0


def _compile() -> dict[str, Any]:
    """The worker loop and the dispatch, or no entries where the team cannot run."""
    if not sys.platform.startswith("linux") or platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return llvm_kernels.compile_functions(
        _IR, {"worker": "team_worker", "run": "team_run"},
        {"worker": ctypes.CFUNCTYPE(None, ptr, ptr, i64), "run": ctypes.CFUNCTYPE(None, ptr, i64, ptr, ptr, i64, ptr)},
        "the products' worker team", "products are split over a thread pool instead, with the same results")


def _field(slot: str, word: int, name: str) -> str:
    return f"  %{name} = getelementptr i64, ptr {slot}, i64 {word}"


_IR = f"""
declare void @llvm.x86.sse2.pause()

; The worker loop never returns: its thread is a daemon, ended with the process.
define void @team_worker(ptr %slot, ptr %sys, i64 %first) {{
entry:
{_field("%slot", _GEN, "gen")}
{_field("%slot", _DONE, "done")}
{_field("%slot", _SLEEPING, "sleeping")}
{_field("%slot", _FN, "fnp")}
{_field("%slot", _ARGS, "argsp")}
{_field("%slot", _LO, "lop")}
{_field("%slot", _HI, "hip")}
  %start = trunc i64 %first to i32  ; the generation when the thread was made: a job posted since is new
  br label %wait
wait:
  %last = phi i32 [ %start, %entry ], [ %g, %ran ], [ %last, %awake ], [ %last, %spin ]
  %spins = phi i64 [ 0, %entry ], [ 0, %ran ], [ 0, %awake ], [ %spins1, %spin ]
  %g = load atomic i32, ptr %gen seq_cst, align 8
  %new = icmp ne i32 %g, %last
  br i1 %new, label %work, label %idle
work:
  %fn = load ptr, ptr %fnp, align 8
  %args = load ptr, ptr %argsp, align 8
  %lo = load i64, ptr %lop, align 8
  %hi = load i64, ptr %hip, align 8
  call void %fn(ptr %args, i64 %lo, i64 %hi)
  store atomic i32 %g, ptr %done seq_cst, align 8
  br label %ran
ran:
  br label %wait
idle:
  %spins1 = add i64 %spins, 1
  %long = icmp ugt i64 %spins1, {SPINS}
  br i1 %long, label %sleep, label %spin
spin:
  call void @llvm.x86.sse2.pause()
  br label %wait
sleep:
  store atomic i32 1, ptr %sleeping seq_cst, align 8
  %g2 = load atomic i32, ptr %gen seq_cst, align 8
  %moved = icmp ne i32 %g2, %last
  br i1 %moved, label %awake, label %block
block:
  %expect = zext i32 %last to i64
  %r = call i64 (i64, ...) %sys(i64 {_SYS_FUTEX}, ptr %gen, i64 {_FUTEX_WAIT_PRIVATE}, i64 %expect, ptr null)
  br label %awake
awake:
  store atomic i32 0, ptr %sleeping seq_cst, align 8
  br label %wait
}}

define void @team_run(ptr %slots, i64 %workers, ptr %fn, ptr %args, i64 %n, ptr %sys) {{
entry:
  %parts = add i64 %workers, 1
  %n1 = add i64 %n, %workers
  %per = udiv i64 %n1, %parts
  br label %post
post:
  %w = phi i64 [ 0, %entry ], [ %w1, %posted ]
  %base = mul i64 %w, {_SLOT_WORDS}
  %slot = getelementptr i64, ptr %slots, i64 %base
  %w1 = add i64 %w, 1
  %lo0 = mul i64 %w1, %per
  %hi0 = add i64 %lo0, %per
  %lo_big = icmp ugt i64 %lo0, %n
  %lo = select i1 %lo_big, i64 %n, i64 %lo0
  %hi_big = icmp ugt i64 %hi0, %n
  %hi = select i1 %hi_big, i64 %n, i64 %hi0
{_field("%slot", _FN, "fnp")}
{_field("%slot", _ARGS, "argsp")}
{_field("%slot", _LO, "lop")}
{_field("%slot", _HI, "hip")}
{_field("%slot", _SLEEPING, "sleepingp")}
  store ptr %fn, ptr %fnp, align 8
  store ptr %args, ptr %argsp, align 8
  store i64 %lo, ptr %lop, align 8
  store i64 %hi, ptr %hip, align 8
  %genp = getelementptr i64, ptr %slot, i64 {_GEN}
  %g = load i32, ptr %genp, align 8
  %g1 = add i32 %g, 1
  store atomic i32 %g1, ptr %genp seq_cst, align 8
  %asleep = load atomic i32, ptr %sleepingp seq_cst, align 8
  %wake = icmp ne i32 %asleep, 0
  br i1 %wake, label %waking, label %posted
waking:
  %r = call i64 (i64, ...) %sys(i64 {_SYS_FUTEX}, ptr %genp, i64 {_FUTEX_WAKE_PRIVATE}, i64 1)
  br label %posted
posted:
  %more = icmp ult i64 %w1, %workers
  br i1 %more, label %post, label %own
own:
  %own_hi_big = icmp ugt i64 %per, %n
  %own_hi = select i1 %own_hi_big, i64 %n, i64 %per
  call void %fn(ptr %args, i64 0, i64 %own_hi)
  br label %collect
collect:
  %v = phi i64 [ 0, %own ], [ %v1, %finished ]
  %vbase = mul i64 %v, {_SLOT_WORDS}
  %vslot = getelementptr i64, ptr %slots, i64 %vbase
{_field("%vslot", _GEN, "vgenp")}
{_field("%vslot", _DONE, "vdonep")}
  %want = load i32, ptr %vgenp, align 8
  br label %poll
poll:
  %polls = phi i64 [ 0, %collect ], [ %polls1, %pause ], [ 0, %yield ]
  %d = load atomic i32, ptr %vdonep seq_cst, align 8
  %ok = icmp eq i32 %d, %want
  br i1 %ok, label %finished, label %pause
pause:
  call void @llvm.x86.sse2.pause()
  %polls1 = add i64 %polls, 1
  %patience = icmp ugt i64 %polls1, {SPINS}
  br i1 %patience, label %yield, label %poll
yield:
  %y = call i64 (i64, ...) %sys(i64 {_SYS_SCHED_YIELD})
  br label %poll
finished:
  %v1 = add i64 %v, 1
  %again = icmp ult i64 %v1, %workers
  br i1 %again, label %collect, label %done
done:
  ret void
}}
"""


_KERNELS = llvm_kernels.CompiledKernels(_compile)

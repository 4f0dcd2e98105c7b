"""A decode step's attention scores, compiled: the keys its mask shows found, and their scores computed, in
two calls for every head of a layer instead of numpy's dozen calls a head.

A decode step's attention (attention_rows.decode_row) was 0.12-0.35 ms a layer at a short history on this
project's 2-core VM, most of it Python and numpy calls around kernels of a few microseconds: finding the
shown runs of keys (ten numpy calls), gathering a short history, a product call per KV head and run, then
the scale and the mask. Two kernels do that work here, in the same arithmetic:

- `runs`: the keys `attention_rows.visible_runs` gives, for one mask row: the 64-key blocks with a key the
  mask shows (a mask value that is not the hidden one, NaN included), consecutive blocks as one run, the
  last run ending after the last shown key; every key when none is shown.
- `scores`: for each KV head, each key of the runs in order and each query head of its group, the products'
  defined arithmetic over d (numerics/vector_product.py: lane j sums q[k]·key[k] for k = j mod 64 in k
  order from +0, each product and sum rounded, then the fixed tree), then times the scale, then plus the
  key's mask value: the bits of `attention_rows.scores` followed by numpy's `*= scale` and `+= mask`. The
  scores are written packed, [kv heads, group, the shown keys], so the softmax's numpy steps that follow run
  on one contiguous array, as the prefill's do.

Where llvmlite cannot build them, or d is no multiple of 16, decode_row keeps its numpy path (the same bits).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from llmbuild.numerics import llvm_kernels
from llmbuild.numerics.addresses import address
from llmbuild.numerics.vector_product import LANES

_VECTOR = 16


def available(d: int) -> bool:
    """Whether the compiled kernels take a head size of d."""
    return d > 0 and d % _VECTOR == 0 and _KERNELS.get("runs") is not None


def runs(mask_row: np.ndarray, hidden: float) -> np.ndarray:
    """[runs, keys shown, start0, stop0, start1, stop1, ...] (int64) for one mask row (float32, contiguous):
    `attention_rows.visible_runs` and the count of its keys."""
    keys = mask_row.shape[0]
    out = np.empty(2 + 2 * (keys // LANES + 1), dtype=np.int64)
    _KERNELS.get("runs")(address(mask_row), keys, hidden, address(out))
    return out


def scores(q: np.ndarray, k: np.ndarray, found: np.ndarray, mask_row: np.ndarray, scale: float) -> np.ndarray:
    """Scores [kv heads, group, keys shown] (float32) of one query row q [heads, d] against the cache
    k [keys, kv heads, d] (both contiguous) over the runs `found` (`runs`), scaled and masked."""
    heads, d = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    shown = int(found[1])
    out = np.empty((kv_heads, group, shown), dtype=np.float32)
    _KERNELS.get("scores")(address(q), kv_heads, group, d, address(k), address(found), address(mask_row),
                           scale, address(out))
    return out


def run_bounds(runs: str) -> str:
    """IR of run %r's %start, %stop and %len, read from the `runs` layout at %{runs}."""
    return f"""  %rs0 = mul i64 %r, 2
  %rs = add i64 %rs0, 2
  %rsp = getelementptr i64, ptr %{runs}, i64 %rs
  %start = load i64, ptr %rsp, align 8
  %re = add i64 %rs, 1
  %rep = getelementptr i64, ptr %{runs}, i64 %re
  %stop = load i64, ptr %rep, align 8
  %len = sub i64 %stop, %start"""


def _runs_ir() -> str:
    """(mask*, keys, hidden, out*): out = [n, shown, start0, stop0, ...]."""
    return f"""
define void @visible_runs(ptr noalias nocapture readonly %mask, i64 %keys, float %hidden, ptr noalias nocapture %out) {{
entry:
  %blocks0 = add i64 %keys, {LANES - 1}
  %blocks = udiv i64 %blocks0, {LANES}
  %none = icmp eq i64 %keys, 0
  br i1 %none, label %empty, label %block
block:
  %b = phi i64 [ 0, %entry ], [ %bnext, %blockend ]
  %n = phi i64 [ 0, %entry ], [ %n2, %blockend ]
  %prev = phi i64 [ -2, %entry ], [ %prev2, %blockend ]
  %last = phi i64 [ -1, %entry ], [ %last2, %blockend ]
  %k0 = mul i64 %b, {LANES}
  %k1a = add i64 %k0, {LANES}
  %k1small = icmp ult i64 %k1a, %keys
  %k1 = select i1 %k1small, i64 %k1a, i64 %keys
  br label %key
key:
  %k = phi i64 [ %k0, %block ], [ %knext, %key ]
  %seen = phi i64 [ -1, %block ], [ %seen2, %key ]
  %mp = getelementptr float, ptr %mask, i64 %k
  %m = load float, ptr %mp, align 4
  %shows = fcmp une float %m, %hidden
  %seen2 = select i1 %shows, i64 %k, i64 %seen
  %knext = add i64 %k, 1
  %kmore = icmp ult i64 %knext, %k1
  br i1 %kmore, label %key, label %keyend
keyend:
  %any = icmp sge i64 %seen2, 0
  br i1 %any, label %shown, label %blockend
shown:
  %follows = add i64 %prev, 1
  %joins = icmp eq i64 %b, %follows
  br i1 %joins, label %extend, label %open
open:
  %slot = mul i64 %n, 2
  %sslot = add i64 %slot, 2
  %sp = getelementptr i64, ptr %out, i64 %sslot
  store i64 %k0, ptr %sp, align 8
  %nopen = add i64 %n, 1
  br label %extend
extend:
  %n1 = phi i64 [ %n, %shown ], [ %nopen, %open ]
  %eslot0 = mul i64 %n1, 2
  %eslot = add i64 %eslot0, 1
  %ep = getelementptr i64, ptr %out, i64 %eslot
  store i64 %k1, ptr %ep, align 8
  br label %blockend
blockend:
  %n2 = phi i64 [ %n, %keyend ], [ %n1, %extend ]
  %prev2 = phi i64 [ %prev, %keyend ], [ %b, %extend ]
  %last2 = phi i64 [ %last, %keyend ], [ %seen2, %extend ]
  %bnext = add i64 %b, 1
  %bmore = icmp ult i64 %bnext, %blocks
  br i1 %bmore, label %block, label %done
done:
  %found = icmp sgt i64 %n2, 0
  br i1 %found, label %clip, label %empty
clip:
  %lslot0 = mul i64 %n2, 2
  %lslot = add i64 %lslot0, 1
  %lp = getelementptr i64, ptr %out, i64 %lslot
  %end = add i64 %last2, 1
  store i64 %end, ptr %lp, align 8
  store i64 %n2, ptr %out, align 8
  br label %count
count:
  %r = phi i64 [ 0, %clip ], [ %rnext, %count ]
  %total = phi i64 [ 0, %clip ], [ %total2, %count ]
{run_bounds("out")}
  %total2 = add i64 %total, %len
  %rnext = add i64 %r, 1
  %rmore = icmp ult i64 %rnext, %n2
  br i1 %rmore, label %count, label %counted
counted:
  %tp = getelementptr i64, ptr %out, i64 1
  store i64 %total2, ptr %tp, align 8
  ret void
empty:
  store i64 1, ptr %out, align 8
  %ep1 = getelementptr i64, ptr %out, i64 1
  store i64 %keys, ptr %ep1, align 8
  %ep2 = getelementptr i64, ptr %out, i64 2
  store i64 0, ptr %ep2, align 8
  %ep3 = getelementptr i64, ptr %out, i64 3
  store i64 %keys, ptr %ep3, align 8
  ret void
}}"""


def _scores_ir() -> str:
    """(q*, kv_heads, group, d, k*, runs*, mask*, scale, out*): see `scores`. A score's lanes are four
    vectors of 16 (lanes 0-15, 16-31, 32-47, 48-63); a pass over d adds one 64-value step of q·key to them,
    a vector whose values lie past d adding nothing (the arithmetic's +0 terms), then the fixed tree:
    (l0 + l1) + (l2 + l3), then halves of 8, 4, 2, 1."""
    t = f"<{_VECTOR} x float>"
    lines = [f"""
define void @decode_scores(ptr noalias nocapture readonly %q, i64 %kvh, i64 %group, i64 %d,
                           ptr noalias nocapture readonly %k, ptr noalias nocapture readonly %runs,
                           ptr noalias nocapture readonly %mask, float %scale, ptr noalias nocapture %out) {{
entry:
  %nruns = load i64, ptr %runs, align 8
  %shownp = getelementptr i64, ptr %runs, i64 1
  %shown = load i64, ptr %shownp, align 8
  %keyrow = mul i64 %kvh, %d
  br label %head
head:
  %h = phi i64 [ 0, %entry ], [ %hnext, %headend ]
  %hoff = mul i64 %h, %d
  br label %run
run:
  %r = phi i64 [ 0, %head ], [ %rnext, %runend ]
  %at = phi i64 [ 0, %head ], [ %atnext, %runend ]
{run_bounds("runs")}
  %atnext = add i64 %at, %len
  %nonempty = icmp sgt i64 %len, 0
  br i1 %nonempty, label %key, label %runend
key:
  %i = phi i64 [ %start, %run ], [ %inext, %keyend ]
  %ko0 = mul i64 %i, %keyrow
  %ko = add i64 %ko0, %hoff
  %krow = getelementptr float, ptr %k, i64 %ko
  %mpt = getelementptr float, ptr %mask, i64 %i
  %mv = load float, ptr %mpt, align 4
  %col0 = sub i64 %i, %start
  %col = add i64 %col0, %at
  br label %row
row:
  %g = phi i64 [ 0, %key ], [ %gnext, %rowend ]
  %qh0 = mul i64 %h, %group
  %qh = add i64 %qh0, %g
  %qo = mul i64 %qh, %d
  %qrow = getelementptr float, ptr %q, i64 %qo
  br label %step
step:
  %s = phi i64 [ 0, %row ], [ %snext, %stepend ]"""]
    for c in range(4):
        lines.append(f"  %a{c} = phi {t} [ zeroinitializer, %row ], [ %n{c}, %stepend ]")
    for c in range(4):  # chunk c of this 64-value step: its lanes' products, where it lies within d
        before = "step" if c == 0 else f"skip{c - 1}"
        lines += [f"  %o{c} = add i64 %s, {c * _VECTOR}", f"  %in{c} = icmp slt i64 %o{c}, %d",
                  f"  br i1 %in{c}, label %add{c}, label %skip{c}", f"add{c}:",
                  f"  %qp{c} = getelementptr float, ptr %qrow, i64 %o{c}",
                  f"  %qv{c} = load {t}, ptr %qp{c}, align 4",
                  f"  %kp{c} = getelementptr float, ptr %krow, i64 %o{c}",
                  f"  %kv{c} = load {t}, ptr %kp{c}, align 4",
                  f"  %m{c} = fmul {t} %qv{c}, %kv{c}", f"  %b{c} = fadd {t} %a{c}, %m{c}", f"  br label %skip{c}",
                  f"skip{c}:", f"  %n{c} = phi {t} [ %a{c}, %{before} ], [ %b{c}, %add{c} ]"]
    lines += ["  br label %stepend", "stepend:", f"  %snext = add i64 %s, {LANES}",
              "  %smore = icmp slt i64 %snext, %d", "  br i1 %smore, label %step, label %tree", "tree:",
              f"  %x = fadd {t} %n0, %n1", f"  %y = fadd {t} %n2, %n3", f"  %h16 = fadd {t} %x, %y"]
    width, name = 16, "h16"
    while width > 2:  # the halves: h[j] + h[j + half]
        half = width // 2
        vector = f"<{width} x float>"
        for part, first in (("l", 0), ("h", half)):
            picks = ", ".join(f"i32 {first + j}" for j in range(half))
            lines.append(f"  %{name}{part} = shufflevector {vector} %{name}, {vector} poison, <{half} x i32> <{picks}>")
        lines.append(f"  %h{half} = fadd <{half} x float> %{name}l, %{name}h")
        width, name = half, f"h{half}"
    lines += ["  %e0 = extractelement <2 x float> %h2, i64 0", "  %e1 = extractelement <2 x float> %h2, i64 1",
              "  %sum = fadd float %e0, %e1",
              "  %scaled = fmul float %sum, %scale",  # then the mask: numpy's `*= scale`, `+= mask`
              "  %masked = fadd float %scaled, %mv",
              "  %oo0 = mul i64 %qh, %shown", "  %oo = add i64 %oo0, %col",
              "  %op = getelementptr float, ptr %out, i64 %oo",
              "  store float %masked, ptr %op, align 4", "  br label %rowend", "rowend:",
              "  %gnext = add i64 %g, 1", "  %gmore = icmp slt i64 %gnext, %group",
              "  br i1 %gmore, label %row, label %keyend", "keyend:",
              "  %inext = add i64 %i, 1", "  %imore = icmp slt i64 %inext, %stop",
              "  br i1 %imore, label %key, label %runend", "runend:",
              "  %rnext = add i64 %r, 1", "  %rmore = icmp slt i64 %rnext, %nruns",
              "  br i1 %rmore, label %run, label %headend", "headend:",
              "  %hnext = add i64 %h, 1", "  %hmore = icmp slt i64 %hnext, %kvh",
              "  br i1 %hmore, label %head, label %done", "done:", "  ret void", "}"]
    return "\n".join(lines)


def _compile() -> dict[Any, Callable[..., None] | None]:
    i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    signatures: dict[Any, Any] = {
        "runs": ctypes.CFUNCTYPE(None, ptr, i64, f32, ptr),
        "scores": ctypes.CFUNCTYPE(None, ptr, i64, i64, i64, ptr, ptr, ptr, f32, ptr),
    }
    return llvm_kernels.compile_functions(
        _runs_ir() + _scores_ir(), {"runs": "visible_runs", "scores": "decode_scores"}, signatures,
        "the compiled scores of a decode step's attention", "numpy computes them, slower, with the same bits")


_KERNELS = llvm_kernels.CompiledKernels(_compile)

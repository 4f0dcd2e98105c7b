"""Attention's value product for a decode step, read where the values lie: each lane's sums, compiled.

The products' defined arithmetic (numerics/vector_product.py) gives output y[n] of x [K] times w [N, K] as
64 lanes, lane j summing x[k] * w[n, k] for k = j (mod 64) in k order, each product and sum rounded, then a
fixed tree over the lanes. In attention's value product x is a row of weights p over the keys and w the
values transposed, [d, keys]; a prefill builds that transposed copy (attention_rows.weighted_values), but in
a decode step the copy was most of the step's attention: a 1.5B's 2048 keys, 2 MB of values, transposed
in 0.3 ms a layer, every token. This kernel accumulates the lanes from the values as the cache holds them,
[keys, kv heads, d]: key i of the row goes to lane (first + i) mod 64, lanes[r, lane, :d] += p[r, i] * v[i, :]
(a product rounded, then a sum rounded: no fused multiply-add), and lanes[r, lane, d] += p[r, i] (the
arithmetic's product with the column of ones, p * 1.0 = p exactly: the sum of the weights rides in the
lanes' next column). The caller then adds the lanes by the fixed tree (`summed`). Lanes start at +0 and
take the keys in order, as the product's do, so the sums are the product's bits (tests/test_weighted_lanes.py
and tests/test_attention_rows.py compare them).

Where llvmlite cannot build the kernel, or d is no multiple of 16, numpy accumulates the same sums, a lane
block of keys at a time.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from llmbuild.numerics import llvm_kernels
from llmbuild.numerics.addresses import address
from llmbuild.numerics.decode_scores import run_bounds
from llmbuild.numerics.vector_product import LANES, tree_sum

_VECTOR = 16


def lanes_for(heads: int, rows: int, d: int) -> np.ndarray:
    """Zero lanes for `accumulate`: [heads, rows, 64, d + 16], the values' sums in columns :d, the weights'
    in column d (16 columns, so that `summed` adds them by its vectors too)."""
    return np.zeros((heads, rows, LANES, d + _VECTOR), dtype=np.float32)


def accumulate(p: np.ndarray, v: np.ndarray, first: int, lanes: np.ndarray) -> None:
    """Add keys of weights p [heads, rows, n] (float32, last axis contiguous) times values v [n, heads, d]
    (float32, last two axes contiguous) into `lanes_for(heads, rows, d)`, key i to lane (first + i) mod 64."""
    heads, rows, n = p.shape
    d = v.shape[2]
    ld = lanes.shape[3]
    if n and d and d % _VECTOR == 0 and p.strides[2] == 4 and v.strides[2] == 4 and v.strides[1] == 4 * d \
            and lanes.flags.c_contiguous and ld == d + _VECTOR:
        parts = [(r0, _KERNELS.get((count, _chunk(count, d))))
                 for r0 in range(0, rows, MAX_ROWS) for count in [min(MAX_ROWS, rows - r0)]]
        if all(run is not None for _, run in parts):  # compiled together: all of them or none
            # Addresses by stride, not by a view a head: a decode step makes these calls every layer.
            p0, v0, lanes0 = address(p), address(v), address(lanes)
            p_head, p_row, v_row = p.strides[0], p.strides[1], v.strides[0]
            lane_row = LANES * ld * 4  # bytes of one row's lanes
            for r0, run in parts:
                for h in range(heads):
                    at = lanes0 + (h * rows + r0) * lane_row
                    run(p0 + h * p_head + r0 * p_row, p_row // 4, v0 + 4 * h * d, v_row, n, first % LANES,
                        at, at + 4 * d, d, ld)
            return
    for start in range(0, n, LANES):  # up to 64 keys a pass: each to a lane of its own
        stop = min(start + LANES, n)
        lane = (first + np.arange(start, stop)) % LANES
        part = p[:, :, start:stop]
        lanes[:, :, lane, :d] += part[..., None] * v[start:stop].transpose(1, 0, 2)[:, None]
        lanes[:, :, lane, d] += part


def summed(lanes: np.ndarray) -> np.ndarray:
    """lanes [..., 64, d] (float32, contiguous) added by the products' fixed tree (vector_product.tree_sum):
    [..., d], compiled where d is a multiple of 16 (numpy's seven passes over a 1.5B's lanes took 0.08 ms of
    a 0.6 ms step)."""
    d = lanes.shape[-1]
    out = np.empty((*lanes.shape[:-2], d), dtype=np.float32)
    run = _KERNELS.get("tree")
    if run is None or d % _VECTOR or not lanes.flags.c_contiguous or not d:
        out[...] = tree_sum(np.moveaxis(lanes, -2, -1))
    else:
        run(address(lanes), out.size // d, d, address(out))
    return out


# A lane's sums for every row of a KV head's group are held in registers while the lane's keys pass (every
# 64th key), `chunk` vectors of 16 values of d at a time: rows x chunk accumulators, at most 24 of AVX-512's
# 32 registers, beside the chunk of values and the broadcast weight. Kernels are compiled for 1 to MAX_ROWS
# rows (a group of query heads per KV head: 3 in SmolLM2, 6 in a 1.5B, 7 in a 7B); more rows run in parts.
MAX_ROWS = 8
_ACCUMULATORS = 24


def _chunk(rows: int, d: int) -> int:
    """Vectors of d a pass holds per row: the most of 4, 2, 1 that fits the accumulators and divides d."""
    return next(c for c in (4, 2, 1) if rows * c <= _ACCUMULATORS and (d // _VECTOR) % c == 0)


def _function(rows: int, chunk: int) -> str:
    """IR of the kernel for `rows` rows, `chunk` vectors a pass: (p*, p_row_elems, v*, v_row_bytes, n, first,
    lanes*, totals*, d, ld): lanes [rows, 64, ld] (columns :d) and the totals (lane l of row r at
    (r * 64 + l) * ld) accumulated in place."""
    t = f"<{_VECTOR} x float>"
    name = f"weighted_lanes_{rows}_{chunk}"
    acc = [(r, j) for r in range(rows) for j in range(chunk)]
    lines = [f"""
define void @{name}(ptr noalias nocapture readonly %p, i64 %prs, ptr noalias nocapture readonly %v, i64 %vrb,
                    i64 %n, i64 %first, ptr %lanes, ptr %totals, i64 %d, i64 %ld) {{
entry:
  br label %lane
lane:
  %l = phi i64 [ 0, %entry ], [ %lnext, %laneend ]
  %l0 = sub i64 %l, %first
  %i0 = and i64 %l0, {LANES - 1}
  %some = icmp slt i64 %i0, %n
  br i1 %some, label %totalsin, label %laneend
totalsin:"""]
    for r in range(rows):
        lines.append(f"  %tr{r} = add i64 %l, {r * LANES}")
        lines.append(f"  %to{r} = mul i64 %tr{r}, %ld")
        lines.append(f"  %tq{r} = getelementptr float, ptr %totals, i64 %to{r}")
        lines.append(f"  %t0_{r} = load float, ptr %tq{r}, align 4")
    lines.append("  br label %tkey\ntkey:")
    lines.append("  %ti = phi i64 [ %i0, %totalsin ], [ %tinext, %tkey ]")
    for r in range(rows):
        lines.append(f"  %ta{r} = phi float [ %t0_{r}, %totalsin ], [ %ts{r}, %tkey ]")
    for r in range(rows):
        lines += [f"  %tro{r} = mul i64 %prs, {r}", f"  %tpi{r} = add i64 %tro{r}, %ti",
                  f"  %tpp{r} = getelementptr float, ptr %p, i64 %tpi{r}",
                  f"  %tpv{r} = load float, ptr %tpp{r}, align 4", f"  %ts{r} = fadd float %ta{r}, %tpv{r}"]
    lines += ["  %tinext = add i64 %ti, 64", "  %tmore = icmp slt i64 %tinext, %n",
              "  br i1 %tmore, label %tkey, label %totalsout", "totalsout:"]
    lines += [f"  store float %ts{r}, ptr %tq{r}, align 4" for r in range(rows)]
    lines += ["  br label %chunk", "chunk:",
              "  %c = phi i64 [ 0, %totalsout ], [ %cnext, %chunkend ]"]
    for r, j in acc:  # this lane's sums of row r, vector j of the chunk, as they stand
        lines += [f"  %lo{r}_{j}a = mul i64 %l, %ld",
                  f"  %lo{r}_{j}c = mul i64 %ld, {r * LANES}", f"  %lo{r}_{j}d = add i64 %lo{r}_{j}c, %lo{r}_{j}a",
                  f"  %lo{r}_{j}e = add i64 %lo{r}_{j}d, %c", f"  %lo{r}_{j} = add i64 %lo{r}_{j}e, {j * _VECTOR}",
                  f"  %lp{r}_{j} = getelementptr float, ptr %lanes, i64 %lo{r}_{j}",
                  f"  %a0_{r}_{j} = load {t}, ptr %lp{r}_{j}, align 4"]
    lines += ["  br label %key", "key:", "  %i = phi i64 [ %i0, %chunk ], [ %inext, %key ]"]
    for r, j in acc:
        lines.append(f"  %a{r}_{j} = phi {t} [ %a0_{r}_{j}, %chunk ], [ %s{r}_{j}, %key ]")
    lines += ["  %vo = mul i64 %i, %vrb", "  %vrow = getelementptr i8, ptr %v, i64 %vo",
              "  %vc = getelementptr float, ptr %vrow, i64 %c"]
    for j in range(chunk):
        lines += [f"  %vp{j} = getelementptr float, ptr %vc, i64 {j * _VECTOR}",
                  f"  %v{j} = load {t}, ptr %vp{j}, align 4"]
    for r in range(rows):
        lines += [f"  %ro{r} = mul i64 %prs, {r}", f"  %pi{r} = add i64 %ro{r}, %i",
                  f"  %pp{r} = getelementptr float, ptr %p, i64 %pi{r}", f"  %pv{r} = load float, ptr %pp{r}, align 4",
                  f"  %pb{r}a = insertelement {t} poison, float %pv{r}, i64 0",
                  f"  %pb{r} = shufflevector {t} %pb{r}a, {t} poison, <{_VECTOR} x i32> zeroinitializer"]
        for j in range(chunk):  # the product rounded, then the sum: no fused multiply-add
            lines += [f"  %m{r}_{j} = fmul {t} %pb{r}, %v{j}", f"  %s{r}_{j} = fadd {t} %a{r}_{j}, %m{r}_{j}"]
    lines += ["  %inext = add i64 %i, 64", "  %more = icmp slt i64 %inext, %n",
              "  br i1 %more, label %key, label %chunkend", "chunkend:"]
    lines += [f"  store {t} %s{r}_{j}, ptr %lp{r}_{j}, align 4" for r, j in acc]
    lines += [f"  %cnext = add i64 %c, {chunk * _VECTOR}", "  %cmore = icmp slt i64 %cnext, %d",
              "  br i1 %cmore, label %chunk, label %laneend", "laneend:",
              "  %lnext = add i64 %l, 1", f"  %lmore = icmp slt i64 %lnext, {LANES}",
              "  br i1 %lmore, label %lane, label %done", "done:", "  ret void", "}"]
    return "\n".join(lines)


def _tree() -> str:
    """IR of (lanes*, rows, d, out*): out[row, c] = the fixed tree over lanes[row, :, c], 16 columns at a time."""
    t = f"<{_VECTOR} x float>"
    lines = [f"""
define void @lane_tree(ptr noalias nocapture readonly %lanes, i64 %rows, i64 %d, ptr noalias nocapture %out) {{
entry:
  %any = icmp sgt i64 %rows, 0
  br i1 %any, label %row, label %done
row:
  %r = phi i64 [ 0, %entry ], [ %rnext, %rowend ]
  %base0 = mul i64 %r, %d
  %base = mul i64 %base0, {LANES}
  br label %col
col:
  %c = phi i64 [ 0, %row ], [ %cnext, %col ]
  %at = add i64 %base, %c"""]
    for lane in range(LANES):
        lines += [f"  %o{lane}a = mul i64 %d, {lane}", f"  %o{lane} = add i64 %at, %o{lane}a",
                  f"  %p{lane} = getelementptr float, ptr %lanes, i64 %o{lane}",
                  f"  %l{lane} = load {t}, ptr %p{lane}, align 4"]
    for j in range(16):  # (l[j] + l[j+16]) + (l[j+32] + l[j+48])
        lines += [f"  %x{j} = fadd {t} %l{j}, %l{j + 16}", f"  %y{j} = fadd {t} %l{j + 32}, %l{j + 48}",
                  f"  %h16_{j} = fadd {t} %x{j}, %y{j}"]
    width = 16
    while width > 1:
        half = width // 2
        for j in range(half):
            lines.append(f"  %h{half}_{j} = fadd {t} %h{width}_{j}, %h{width}_{j + half}")
        width = half
    lines += ["  %oo0 = mul i64 %r, %d", "  %oo = add i64 %oo0, %c", "  %op = getelementptr float, ptr %out, i64 %oo",
              f"  store {t} %h1_0, ptr %op, align 4", f"  %cnext = add i64 %c, {_VECTOR}",
              "  %cmore = icmp slt i64 %cnext, %d", "  br i1 %cmore, label %col, label %rowend", "rowend:",
              "  %rnext = add i64 %r, 1", "  %rmore = icmp slt i64 %rnext, %rows",
              "  br i1 %rmore, label %row, label %done", "done:", "  ret void", "}"]
    return "\n".join(lines)


def row_available(group: int, d: int) -> bool:
    """Whether `weighted_row` takes a group of this many query heads with values of d."""
    return 0 < group <= MAX_ROWS and d > 0 and d % _VECTOR == 0 and _KERNELS.get("row") is not None


def weighted_row(p: np.ndarray, v: np.ndarray, found: np.ndarray) -> np.ndarray:
    """A decode step's attention output [1, 1, heads * d] from its weights p [kv heads, group, keys shown]
    (float32, contiguous: the softmax's numerators over the runs `found`, decode_scores.runs) and the cache's
    values v [keys, kv heads, d] (contiguous), in one call: every head's lanes (`accumulate`'s), their tree
    (`summed`'s) and the division by the weights' sum, each value's bits those of the calls it replaces.
    Where `row_available` (the caller checks)."""
    kv_heads, group, shown = p.shape
    d = v.shape[2]
    assert p.flags.c_contiguous and v.flags.c_contiguous and p.dtype == v.dtype == np.float32
    lanes = np.empty((kv_heads, group, LANES, d + _VECTOR), dtype=np.float32)  # zeroed by the kernel
    sums = np.empty((kv_heads * group, d + _VECTOR), dtype=np.float32)
    out = np.empty((1, 1, kv_heads * group * d), dtype=np.float32)
    _KERNELS.get("row")(address(p), shown, kv_heads, group, d, address(v), address(found), address(lanes),
        _KERNELS.get((group, _chunk(group, d), "address")), address(sums), address(out))
    return out


def _row() -> str:
    """IR of (p*, shown, kv_heads, group, d, v*, runs*, lanes*, kernel*, sums*, out*): `weighted_row`, the
    lanes kernel for the group's rows passed by address."""
    t = f"<{_VECTOR} x float>"
    return f"""
declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)

define void @weighted_row(ptr noalias nocapture readonly %p, i64 %shown, i64 %kvh, i64 %group, i64 %d,
                          ptr noalias nocapture readonly %v, ptr noalias nocapture readonly %runs, ptr %lanes,
                          ptr %kernel, ptr noalias nocapture %sums, ptr noalias nocapture %out) {{
entry:
  %ld = add i64 %d, {_VECTOR}
  %rows = mul i64 %kvh, %group
  %lanesize0 = mul i64 %rows, {LANES * 4}
  %lanesize = mul i64 %lanesize0, %ld
  call void @llvm.memset.p0.i64(ptr %lanes, i8 0, i64 %lanesize, i1 false)
  %nruns = load i64, ptr %runs, align 8
  %keyrow0 = mul i64 %kvh, %d
  %vrb = mul i64 %keyrow0, 4
  %headlanes0 = mul i64 %group, {LANES * 4}
  %headlanes = mul i64 %headlanes0, %ld
  %dbytes = mul i64 %d, 4
  br label %head
head:
  %h = phi i64 [ 0, %entry ], [ %hnext, %headend ]
  %lo = mul i64 %h, %headlanes
  %lh = getelementptr i8, ptr %lanes, i64 %lo
  %th = getelementptr i8, ptr %lh, i64 %dbytes
  %voff = mul i64 %h, %dbytes
  %vh = getelementptr i8, ptr %v, i64 %voff
  %prow0 = mul i64 %h, %group
  %prow = mul i64 %prow0, %shown
  br label %run
run:
  %r = phi i64 [ 0, %head ], [ %rnext, %run ]
  %at = phi i64 [ 0, %head ], [ %atnext, %run ]
{run_bounds("runs")}
  %po = add i64 %prow, %at
  %pp = getelementptr float, ptr %p, i64 %po
  %vo = mul i64 %start, %vrb
  %vp = getelementptr i8, ptr %vh, i64 %vo
  %first = and i64 %at, {LANES - 1}
  call void %kernel(ptr %pp, i64 %shown, ptr %vp, i64 %vrb, i64 %len, i64 %first, ptr %lh, ptr %th, i64 %d, i64 %ld)
  %atnext = add i64 %at, %len
  %rnext = add i64 %r, 1
  %rmore = icmp slt i64 %rnext, %nruns
  br i1 %rmore, label %run, label %headend
headend:
  %hnext = add i64 %h, 1
  %hmore = icmp slt i64 %hnext, %kvh
  br i1 %hmore, label %head, label %tree
tree:
  call void @lane_tree(ptr %lanes, i64 %rows, i64 %ld, ptr %sums)
  br label %divrow
divrow:
  %q = phi i64 [ 0, %tree ], [ %qnext, %divrowend ]
  %so = mul i64 %q, %ld
  %srow = getelementptr float, ptr %sums, i64 %so
  %wp = getelementptr float, ptr %srow, i64 %d
  %w = load float, ptr %wp, align 4
  %w1 = insertelement {t} poison, float %w, i64 0
  %ws = shufflevector {t} %w1, {t} poison, <{_VECTOR} x i32> zeroinitializer
  %oo = mul i64 %q, %d
  %orow = getelementptr float, ptr %out, i64 %oo
  br label %divcol
divcol:
  %c = phi i64 [ 0, %divrow ], [ %cnext, %divcol ]
  %sp = getelementptr float, ptr %srow, i64 %c
  %sv = load {t}, ptr %sp, align 4
  %dv = fdiv {t} %sv, %ws
  %op = getelementptr float, ptr %orow, i64 %c
  store {t} %dv, ptr %op, align 4
  %cnext = add i64 %c, {_VECTOR}
  %cmore = icmp slt i64 %cnext, %d
  br i1 %cmore, label %divcol, label %divrowend
divrowend:
  %qnext = add i64 %q, 1
  %qmore = icmp slt i64 %qnext, %rows
  br i1 %qmore, label %divrow, label %done
done:
  ret void
}}"""


def _compile() -> dict[Any, Callable[..., None] | int | None]:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    signature = ctypes.CFUNCTYPE(None, ptr, i64, ptr, i64, i64, i64, ptr, ptr, i64, i64)
    shapes = [(rows, chunk) for rows in range(1, MAX_ROWS + 1) for chunk in (4, 2, 1) if rows * chunk <= _ACCUMULATORS]
    symbols: dict[Any, str] = {shape: f"weighted_lanes_{shape[0]}_{shape[1]}" for shape in shapes}
    signatures: dict[Any, Any] = dict.fromkeys(shapes, signature)
    # The kernels' addresses too: `weighted_row` calls the one for its group's rows.
    symbols |= {(*shape, "address"): symbols[shape] for shape in shapes}
    signatures |= dict.fromkeys(((*shape, "address") for shape in shapes), None)
    symbols["tree"], signatures["tree"] = "lane_tree", ctypes.CFUNCTYPE(None, ptr, i64, i64, ptr)
    symbols["row"] = "weighted_row"
    signatures["row"] = ctypes.CFUNCTYPE(None, ptr, i64, i64, i64, i64, ptr, ptr, ptr, ptr, ptr, ptr)
    return llvm_kernels.compile_functions(
        "\n".join(_function(rows, chunk) for rows, chunk in shapes) + _tree() + _row(), symbols, signatures,
        "the compiled value product of a decode step's attention",
        "numpy accumulates its lanes, slower, with the same bits")


_KERNELS = llvm_kernels.CompiledKernels(_compile)

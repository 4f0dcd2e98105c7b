"""The 4-bit round-to-nearest of `rtn.py`, compiled to one pass over the weight (LLVM IR, as the products).

A build from a float checkpoint rounds each layer's projections in its layer job and in each of the
layer's bmodel nets: numpy's passes (`rtn._rtn4_block`: min and max through a transposed copy, then five
passes over the quotients) take about 0.45 s for a 1.5B layer. This kernel reads each group of weights once
for its min and max and once for its levels, in vector registers.

The same results as the numpy passes for every finite weight (tests/test_rtn_kernel.py, bit for bit on the
levels and the scales, value for value on the zero points): min and max are exact in any order, the scale
is the same division, and the rounding is the same two float32 operations (`rtn.round_near_half_away_inplace`
for the levels, `rtn.round_half_away` for the zero point), each IEEE-exact. A weight with a NaN or an
infinity is rounded by numpy's passes instead (the kernel reports it), which define what such a group gives.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

from llmbuild.numerics import llvm_kernels
from llmbuild.numerics.llvm_kernels import splat

_VECTOR = 16


def takes(weight: np.ndarray, group: int) -> bool:
    """Whether the kernel rounds this float32 [N, K] weight in groups of `group`."""
    return (weight.dtype == np.float32 and weight.ndim == 2 and group % _VECTOR == 0 and group > 0
            and weight.shape[1] % group == 0 and _compiled() is not None)


def rtn4(weight: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(levels uint8 [N, K], scale float32 [N, K/g], zero float32 [N, K/g]) of a float32 weight, or None
    when a weight is not finite (the caller rounds it with numpy's passes)."""
    run = _compiled()
    assert run is not None and takes(weight, group), "rtn_kernel.rtn4: check takes() first"
    w = np.ascontiguousarray(weight)
    n, k = w.shape
    q = np.empty((n, k), dtype=np.uint8)
    scale = np.empty((n, k // group), dtype=np.float32)
    zero = np.empty((n, k // group), dtype=np.float32)
    if n == 0:
        return q, scale, zero
    bad = run(w.ctypes.data, n, k, group, q.ctypes.data, scale.ctypes.data, zero.ctypes.data)
    return None if bad else (q, scale, zero)


def _compiled() -> Callable[..., int] | None:
    return _KERNELS.get("rtn4")


def _compile() -> dict[str, Callable[..., int] | None]:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return llvm_kernels.compile_functions(
        _ir(), {"rtn4": "rtn4_rows"}, ctypes.CFUNCTYPE(i64, ptr, i64, i64, i64, ptr, ptr, ptr),
        "the compiled round-to-nearest", "numpy rounds, slower, with the same levels")


def _scalar_round_half_away(y: str, out: str) -> list[str]:
    """`rtn.round_half_away` of the float32 `y`: t = trunc(y), plus sign(y) where |y - t| >= 0.5."""
    return [f"  %{out}t = call float @llvm.trunc.f32(float {y})",
            f"  %{out}f = fsub float {y}, %{out}t",
            f"  %{out}a = call float @llvm.fabs.f32(float %{out}f)",
            f"  %{out}h = fcmp oge float %{out}a, 0x3FE0000000000000",
            f"  %{out}p = fcmp ogt float {y}, 0.0",
            f"  %{out}n = fcmp olt float {y}, 0.0",
            f"  %{out}s0 = select i1 %{out}n, float -1.0, float 0.0",
            f"  %{out}s = select i1 %{out}p, float 1.0, float %{out}s0",
            f"  %{out}d = select i1 %{out}h, float %{out}s, float 0.0",
            f"  %{out} = fadd float %{out}t, %{out}d"]


def _ir() -> str:
    """Per row, per group: min and max over 16-lane vectors (NaN-propagating, so a NaN or infinity shows in
    max - min), the scale and zero point as scalars, then the levels 16 at a time."""
    below_half = float(np.nextafter(np.float32(0.5), np.float32(0)))
    below_hex = f"0x{np.float64(below_half).view(np.uint64):016X}"
    floor_hex = f"0x{np.float64(np.float32(1e-5)).view(np.uint64):016X}"
    v = f"<{_VECTOR} x float>"
    return f"""
declare float @llvm.trunc.f32(float)
declare float @llvm.fabs.f32(float)
declare {v} @llvm.trunc.v16f32({v})
declare {v} @llvm.copysign.v16f32({v}, {v})
declare {v} @llvm.minimum.v16f32({v}, {v})
declare {v} @llvm.maximum.v16f32({v}, {v})
declare float @llvm.vector.reduce.fminimum.v16f32({v})
declare float @llvm.vector.reduce.fmaximum.v16f32({v})

define i64 @rtn4_rows(ptr noalias nocapture readonly %w, i64 %rows, i64 %K, i64 %group, ptr noalias nocapture %q,
                      ptr noalias nocapture %sc, ptr noalias nocapture %zp) {{
entry:
  %groups = udiv i64 %K, %group
  %total = mul i64 %rows, %groups
  br label %grp
grp:
  %gi = phi i64 [ 0, %entry ], [ %gi1, %levels_end ]
  %base = mul i64 %gi, %group
  %wg = getelementptr float, ptr %w, i64 %base
  %v0 = load {v}, ptr %wg, align 4
  br label %minmax
minmax:
  %i = phi i64 [ {_VECTOR}, %grp ], [ %i1, %minmax_body ]
  %lo = phi {v} [ %v0, %grp ], [ %lo1, %minmax_body ]
  %hi = phi {v} [ %v0, %grp ], [ %hi1, %minmax_body ]
  %more = icmp slt i64 %i, %group
  br i1 %more, label %minmax_body, label %minmax_end
minmax_body:
  %wp = getelementptr float, ptr %wg, i64 %i
  %x = load {v}, ptr %wp, align 4
  %lo1 = call {v} @llvm.minimum.v16f32({v} %lo, {v} %x)
  %hi1 = call {v} @llvm.maximum.v16f32({v} %hi, {v} %x)
  %i1 = add i64 %i, {_VECTOR}
  br label %minmax
minmax_end:
  %lmin = call float @llvm.vector.reduce.fminimum.v16f32({v} %lo)
  %lmax = call float @llvm.vector.reduce.fmaximum.v16f32({v} %hi)
  %range = fsub float %lmax, %lmin
  %finite = fcmp olt float %range, 0x7FF0000000000000
  br i1 %finite, label %scale, label %bad
scale:
  %fl = fcmp oge float %range, {floor_hex}
  %rg = select i1 %fl, float %range, float {floor_hex}
  %s = fdiv float %rg, 15.0
  %y = fdiv float %lmin, %s
{chr(10).join(_scalar_round_half_away("%y", "ry"))}
  %nz = fneg float %ry
  %z0c = fcmp ogt float %nz, 0.0
  %z0 = select i1 %z0c, float %nz, float 0.0
  %z1c = fcmp olt float %z0, 15.0
  %z = select i1 %z1c, float %z0, float 15.0
  %sp = getelementptr float, ptr %sc, i64 %gi
  store float %s, ptr %sp, align 4
  %zpp = getelementptr float, ptr %zp, i64 %gi
  store float %z, ptr %zpp, align 4
  %ss0 = insertelement {v} poison, float %s, i64 0
  %ss = shufflevector {v} %ss0, {v} poison, <{_VECTOR} x i32> zeroinitializer
  %zs0 = insertelement {v} poison, float %z, i64 0
  %zs = shufflevector {v} %zs0, {v} poison, <{_VECTOR} x i32> zeroinitializer
  br label %levels
levels:
  %j = phi i64 [ 0, %scale ], [ %j1, %levels ]
  %lp = getelementptr float, ptr %wg, i64 %j
  %lx = load {v}, ptr %lp, align 4
  %ld = fdiv {v} %lx, %ss
  %lh = call {v} @llvm.copysign.v16f32({v} {splat(_VECTOR, "float", below_hex)}, {v} %ld)
  %la = fadd {v} %ld, %lh
  %lt = call {v} @llvm.trunc.v16f32({v} %la)
  %lz = fadd {v} %lt, %zs
  %lc0 = fcmp ogt {v} %lz, zeroinitializer
  %lc = select <{_VECTOR} x i1> %lc0, {v} %lz, {v} zeroinitializer
  %lu0 = fcmp olt {v} %lc, {splat(_VECTOR, "float", "15.0")}
  %lu = select <{_VECTOR} x i1> %lu0, {v} %lc, {v} {splat(_VECTOR, "float", "15.0")}
  %lq = fptoui {v} %lu to <{_VECTOR} x i8>
  %qo = add i64 %base, %j
  %qp = getelementptr i8, ptr %q, i64 %qo
  store <{_VECTOR} x i8> %lq, ptr %qp, align 1
  %j1 = add i64 %j, {_VECTOR}
  %jmore = icmp slt i64 %j1, %group
  br i1 %jmore, label %levels, label %levels_end
levels_end:
  %gi1 = add i64 %gi, 1
  %gmore = icmp slt i64 %gi1, %total
  br i1 %gmore, label %grp, label %done
done:
  ret i64 0
bad:
  ret i64 1
}}
"""


_KERNELS = llvm_kernels.CompiledKernels(_compile)

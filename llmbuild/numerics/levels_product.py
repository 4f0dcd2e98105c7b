"""A decode step's product straight from 4-bit or 8-bit levels: dequantized in registers, never in memory.

A 7B w4 model's decode step reads every projection's levels once. Dequantizing them into a float32 block
first (even one in the cache) writes and reads four bytes for every half byte of levels; here each block
of 64 levels is widened, offset by its group's zero point, scaled and rounded to bf16 in vector registers
and multiplied at once. The values are A16MatMul's dequantizer's (op_defs/a16_matmul.py): float32(level)
minus float32(zero), times the float32 scale, in float32, then rounded to nearest even in bf16 (the
canonical NaN for a NaN) when `dequant_dtype` is bf16; the product is vector_product's arithmetic over
those values. So the result has the bits of dequantizing first and multiplying after
(tests/test_levels_product.py), on any thread count: each output is one thread's.

Taken for one-row products whose weight has float32 scales, a group of a multiple of 64 and `dequant_dtype`
bf16 or none; the levels two to a byte (even k in the low nibble) or one to a byte.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from llmbuild.numerics import vector_product
from llmbuild.numerics.parallel import TILE_THREAD_PREFIX, tile_map, workers
from llmbuild.numerics.vector_product import LANES

_VECTOR = 16
PARALLEL_WEIGHTS = 1 << 22  # weights above which the rows are split over the worker threads
_KINDS = [(bits, rounded) for bits in (4, 8) for rounded in (True, False)]


def supported(attrs: dict[str, Any], k: int) -> bool:
    """Whether a weight quantized under `attrs` with K = `k` can take the fused kernel (float32 scales are
    the caller's to check)."""
    group = attrs.get("q_group_size", 0)
    return (k % LANES == 0 and group > 0 and group % LANES == 0 and k % group == 0
            and attrs.get("dequant_dtype") in ("bf16", None) and kernel(_bits(attrs), _rounded(attrs)) is not None)


def product(x: np.ndarray, attrs: dict[str, Any], levels: np.ndarray, scale: np.ndarray, zero: np.ndarray,
            out: np.ndarray) -> None:
    """out [N] = x [K] times the weight of `levels` [N, K/2 or K] (uint8), `scale` and `zero` [N, K/g]
    (float32), dequantized as `attrs` says; every array C-contiguous."""
    n = levels.shape[0]
    k = x.shape[0]
    run = kernel(_bits(attrs), _rounded(attrs))
    assert run is not None and supported(attrs, k), "levels_product.product: check supported() first"
    group = attrs["q_group_size"]
    args = (x.ctypes.data, levels.ctypes.data, levels.strides[0], scale.ctypes.data, zero.ctypes.data,
            scale.strides[0] // 4, group, out.ctypes.data)
    threads = 1
    if n * k >= PARALLEL_WEIGHTS and not threading.current_thread().name.startswith(TILE_THREAD_PREFIX):
        threads = workers() if n >= 2 * workers() else 1
    if threads == 1:
        run(*args, 0, n, k)
        return
    per = -(-n // threads)
    tile_map(lambda lo: run(*args, lo, min(n, lo + per), k), range(0, n, per))


def _bits(attrs: dict[str, Any]) -> int:
    return 4 if attrs.get("packed") else 8


def _rounded(attrs: dict[str, Any]) -> bool:
    return attrs.get("dequant_dtype") == "bf16"


# ---- the compiled kernel ---------------------------------------------------------------------------

_lock = threading.Lock()
_kernels: dict[tuple[int, bool], Callable[..., None] | None] = {}
_keep: list[Any] = []


def kernel(bits: int, rounded: bool) -> Callable[..., None] | None:
    """The compiled product: `(x*, levels*, level_row_bytes, scale*, zero*, groups_per_row, group, y*, n_lo,
    n_hi, K)`; None when it cannot be built."""
    if (bits, rounded) not in _KINDS:
        return None
    if not _kernels:
        with _lock:
            if not _kernels:
                _kernels.update(_compile())
    return _kernels[(bits, rounded)]


def _name(bits: int, rounded: bool) -> str:
    return f"levels_product_w{bits}{'_bf16' if rounded else ''}"


def _compile() -> dict[tuple[int, bool], Callable[..., None] | None]:
    try:
        engine = vector_product.compile_ir("\n".join(_ir(bits, rounded) for bits, rounded in _KINDS))
    except Exception as error:
        warnings.warn(f"llmbuild: the compiled 4/8-bit product is unavailable ({error}); decode dequantizes "
                      "blocks first, slower, with the same results", RuntimeWarning, stacklevel=3)
        return dict.fromkeys(_KINDS)
    _keep.append(engine)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    signature = ctypes.CFUNCTYPE(None, ptr, ptr, i64, ptr, ptr, i64, i64, ptr, i64, i64, i64)
    return {kind: signature(engine.get_function_address(_name(*kind))) for kind in _KINDS}


def _splat(width: int, element: str, value: str) -> str:
    return "<" + ", ".join([f"{element} {value}"] * width) + ">"


def _levels(bits: int) -> list[str]:
    """IR loading the 64 levels of the block at k (row %lrow) as %q, <64 x i8> in k order."""
    if bits == 8:
        return ["  %lp = getelementptr i8, ptr %lrow, i64 %k", "  %q = load <64 x i8>, ptr %lp, align 1"]
    interleave = ", ".join(f"i32 {i}, i32 {i + 32}" for i in range(32))
    return ["  %kh = lshr i64 %k, 1",
            "  %lp = getelementptr i8, ptr %lrow, i64 %kh",
            "  %lb = load <32 x i8>, ptr %lp, align 1",
            f"  %lo4 = and <32 x i8> %lb, {_splat(32, 'i8', '15')}",
            f"  %hi4 = lshr <32 x i8> %lb, {_splat(32, 'i8', '4')}",
            f"  %q = shufflevector <32 x i8> %lo4, <32 x i8> %hi4, <64 x i32> <{interleave}>"]


def _dequantized(rounded: bool) -> list[str]:
    """IR from %q to %wv, <64 x float>: (level - zero) * scale, rounded to bf16 when `rounded`."""
    lines = ["  %g = udiv i64 %k, %group",
             "  %sp = getelementptr float, ptr %srow, i64 %g",
             "  %s = load float, ptr %sp, align 4",
             "  %zp = getelementptr float, ptr %zrow, i64 %g",
             "  %z = load float, ptr %zp, align 4",
             "  %s1 = insertelement <64 x float> poison, float %s, i64 0",
             "  %ss = shufflevector <64 x float> %s1, <64 x float> poison, <64 x i32> zeroinitializer",
             "  %z1 = insertelement <64 x float> poison, float %z, i64 0",
             "  %zs = shufflevector <64 x float> %z1, <64 x float> poison, <64 x i32> zeroinitializer",
             "  %qf = uitofp <64 x i8> %q to <64 x float>",
             "  %d = fsub <64 x float> %qf, %zs"]
    if not rounded:
        return [*lines, "  %wv = fmul <64 x float> %d, %ss"]
    i32 = lambda value: _splat(64, "i32", value)  # noqa: E731
    return [*lines,
            "  %v = fmul <64 x float> %d, %ss",
            "  %b = bitcast <64 x float> %v to <64 x i32>",
            f"  %odd0 = lshr <64 x i32> %b, {i32('16')}",
            f"  %odd = and <64 x i32> %odd0, {i32('1')}",
            f"  %up0 = add <64 x i32> %b, {i32('32767')}",
            "  %up = add <64 x i32> %up0, %odd",
            f"  %r = and <64 x i32> %up, {i32('-65536')}",
            f"  %abs = and <64 x i32> %b, {i32('2147483647')}",
            f"  %nan = icmp ugt <64 x i32> %abs, {i32('2139095040')}",
            f"  %rn = select <64 x i1> %nan, <64 x i32> {i32('2143289344')}, <64 x i32> %r",
            "  %wv = bitcast <64 x i32> %rn to <64 x float>"]


def _ir(bits: int, rounded: bool) -> str:
    """Per output row n: each block of 64 levels dequantized into %wv, its four 16-lane quarters multiplied
    with x and added to the four accumulators; then the lane tree."""
    body = [*_levels(bits), *_dequantized(rounded)]
    for a in range(LANES // _VECTOR):
        quarter = ", ".join(f"i32 {a * _VECTOR + i}" for i in range(_VECTOR))
        body += [f"  %w{a} = shufflevector <64 x float> %wv, <64 x float> poison, <16 x i32> <{quarter}>",
                 f"  %k{a} = add i64 %k, {a * _VECTOR}",
                 f"  %xp{a} = getelementptr float, ptr %x, i64 %k{a}",
                 f"  %xv{a} = load <16 x float>, ptr %xp{a}, align 4",
                 f"  %p{a} = fmul <16 x float> %xv{a}, %w{a}",
                 f"  %na{a} = fadd <16 x float> %a{a}, %p{a}"]
    phis = "\n".join(f"  %a{a} = phi <16 x float> [ zeroinitializer, %row ], [ %na{a}, %kloop ]"
                     for a in range(LANES // _VECTOR))
    newline = "\n"
    return f"""
define void @{_name(bits, rounded)}(ptr noalias nocapture readonly %x, ptr noalias nocapture readonly %l,
    i64 %lstride, ptr noalias nocapture readonly %sc, ptr noalias nocapture readonly %ze, i64 %groups,
    i64 %group, ptr noalias nocapture %y, i64 %lo, i64 %hi, i64 %K) {{
entry:
  %none = icmp sge i64 %lo, %hi
  br i1 %none, label %done, label %row
row:
  %n = phi i64 [ %lo, %entry ], [ %n1, %rowend ]
  %loff = mul i64 %n, %lstride
  %lrow = getelementptr i8, ptr %l, i64 %loff
  %goff = mul i64 %n, %groups
  %srow = getelementptr float, ptr %sc, i64 %goff
  %zrow = getelementptr float, ptr %ze, i64 %goff
  br label %kloop
kloop:
  %k = phi i64 [ 0, %row ], [ %knext, %kloop ]
{phis}
{newline.join(body)}
  %knext = add i64 %k, {LANES}
  %more = icmp slt i64 %knext, %K
  br i1 %more, label %kloop, label %rowend
rowend:
{vector_product.lane_tree(["%na0", "%na1", "%na2", "%na3"], "sum")}
  %yp = getelementptr float, ptr %y, i64 %n
  store float %sum, ptr %yp, align 4
  %n1 = add i64 %n, 1
  %rows = icmp slt i64 %n1, %hi
  br i1 %rows, label %row, label %done
done:
  ret void
}}
"""

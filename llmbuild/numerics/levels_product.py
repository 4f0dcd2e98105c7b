"""A decode step's product straight from 4-bit or 8-bit levels: dequantized in registers, never in memory.

A 7B w4 model's decode step reads every projection's levels once. Dequantizing them into a float32 block
first (even one in the cache) writes and reads four bytes for every half byte of levels; here each block
of 64 levels is widened, offset by its group's zero point, scaled and rounded to bf16 in vector registers
and multiplied at once. The values are A16MatMul's dequantizer's (op_defs/a16_matmul.py): float32(level)
minus float32(zero), times the float32 scale, in float32, then rounded to nearest even in bf16 (the
canonical NaN for a NaN) when `dequant_dtype` is bf16; the product is vector_product's arithmetic over
those values. So the result has the bits of dequantizing first and multiplying after
(tests/test_levels_product.py), on any thread count: each output is one thread's.

4-bit levels have three forms, each with those bits, and the CPU's fastest is taken: looked up in a
16-entry table of the group's values by AVX-512F's `vpermps` ("permute"), by AVX2's byte shuffle
("shuffle", levels_shuffle.py; bf16 rounding only), or dequantized by arithmetic like 8-bit levels
("arithmetic": any CPU LLVM targets).

Taken for one-row products whose weight has float32 scales, a group of a multiple of 64 and `dequant_dtype`
bf16 or none; the levels two to a byte (even k in the low nibble) or one to a byte.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from llmbuild.numerics import levels_shuffle, llvm_kernels, team, vector_product
from llmbuild.numerics.addresses import address
from llmbuild.numerics.llvm_kernels import splat
from llmbuild.numerics.parallel import row_spans
from llmbuild.numerics.vector_product import LANES

_VECTOR = 16
# How far ahead of the block it multiplies the kernel asks for levels (benchmarks/product_kernels.py; 0:
# no prefetch). A decode step streams every projection's levels from memory once, and the hardware's
# prefetcher alone kept a 1.5B's MLP levels (578 MB, 84 products, two threads of a 2-core Xeon) at 7 GB/s:
# 82-83 ms; asking 512, 1024, 2048 and 4096 bytes ahead, 68-69, 62-63, 60-61 and 56-62 ms. At 2048 the other
# forms too: "shuffle" 115 -> 69-75 ms, "arithmetic" 122-134 -> 101-109, 8-bit levels (half the products,
# twice the bytes) 96-104 -> 55-58.
PREFETCH_BYTES = 2048
PARALLEL_WEIGHTS = 1 << 22  # weights above which the rows are split over the worker threads
# How 4-bit levels become weights (8-bit ones: arithmetic), fastest first; each form with the same bits.
METHODS = ("permute", "shuffle", "arithmetic")
KINDS = [(bits, rounded, method) for bits in (4, 8) for rounded in (True, False) for method in METHODS
          if method == "arithmetic" or (bits == 4 and (rounded or method != "shuffle"))]


def supported(attrs: dict[str, Any], k: int) -> bool:
    """Whether a weight quantized under `attrs` with K = `k` can take the fused kernel (float32 scales are
    the caller's to check)."""
    group = attrs.get("q_group_size", 0)
    return (k > 0 and k % LANES == 0 and group > 0 and group % LANES == 0 and k % group == 0
            and attrs.get("dequant_dtype") in ("bf16", None) and kernel(_bits(attrs), _rounded(attrs)) is not None)


def takes(attrs: dict[str, Any], k: int, scale_dtype: np.dtype) -> bool:
    """Whether a one-row product over a weight quantized under `attrs`, K = `k`, with scales decoded to
    `scale_dtype`, runs here from its levels (`supported`, and float32 scales)."""
    return np.dtype(scale_dtype) == np.float32 and supported(attrs, k)


def product(x: np.ndarray, attrs: dict[str, Any], levels: np.ndarray, scale: np.ndarray, zero: np.ndarray,
            out: np.ndarray, method: str | None = None) -> None:
    """out [N] = x [K] times the weight of `levels` [N, K/2 or K] (uint8), `scale` and `zero` [N, K/g]
    (float32), dequantized as `attrs` says; every array C-contiguous. `method`: one of METHODS for 4-bit
    levels, or None, this CPU's fastest: the same bits."""
    n = levels.shape[0]
    k = x.shape[0]
    key = _key(_bits(attrs), _rounded(attrs), method)
    run = _KERNELS.get(key)
    assert run is not None and supported(attrs, k), "levels_product.product: check supported() first"
    group = attrs["q_group_size"]
    args = (address(x), address(levels), levels.strides[0], address(scale), address(zero),
            scale.strides[0] // 4, group, address(out))
    span = _KERNELS.get(("span", key))
    threshold = vector_product.TEAM_WEIGHTS if team.available() else PARALLEL_WEIGHTS
    row_spans(n, n * k, threshold, lambda lo, hi: run(*args, lo, hi, k), (span, (*args, k)))


def _bits(attrs: dict[str, Any]) -> int:
    return 4 if attrs.get("packed") else 8


def _rounded(attrs: dict[str, Any]) -> bool:
    return attrs.get("dequant_dtype") == "bf16"


# ---- the compiled kernel ---------------------------------------------------------------------------



def kernel(bits: int, rounded: bool, method: str | None = None) -> Callable[..., None] | None:
    """The compiled product: `(x*, levels*, level_row_bytes, scale*, zero*, groups_per_row, group, y*, n_lo,
    n_hi, K)`; None when it cannot be built (a form this CPU lacks, or no llvmlite)."""
    return _KERNELS.get(_key(bits, rounded, method))


def _key(bits: int, rounded: bool, method: str | None) -> tuple[int, bool, str]:
    """The kernel's key: `method` None is the first of METHODS this CPU has for these levels."""
    return (bits, rounded, _fastest(bits, rounded) if method is None else method)


@cache
def _fastest(bits: int, rounded: bool) -> str:
    """The first of METHODS this CPU has for these levels, found once (every decode product asks)."""
    return next(m for m in METHODS if m == "arithmetic" or _KERNELS.get((bits, rounded, m)) is not None)


def _name(bits: int, rounded: bool, method: str) -> str:
    return f"levels_product_w{bits}{'_bf16' if rounded else ''}_{method}"


def _compile() -> dict[Any, Any]:
    features = llvm_kernels.cpu_features()
    needs = {"permute": "avx512f", "shuffle": "avx2"}
    kinds = [kind for kind in KINDS if needs.get(kind[2], "") in features | {""}]
    ir = "\n".join(levels_shuffle.ir(_name(*kind), PREFETCH_BYTES) if kind[2] == "shuffle" else _ir(*kind)
                   for kind in kinds)
    if any(kind[2] == "permute" for kind in kinds):
        ir += "\ndeclare <16 x float> @llvm.x86.avx512.permvar.sf.512(<16 x float>, <16 x i32>)\n"
    if any(kind[2] == "shuffle" for kind in kinds):
        ir += levels_shuffle.DECLARATIONS
    ir += llvm_kernels.PREFETCH_DECLARATION
    spans, symbols, signatures = team.with_spans({kind: _name(*kind) for kind in kinds}, _PARAMS, 8)
    return llvm_kernels.compile_functions(
        ir + spans, symbols, signatures,
        "the compiled 4/8-bit product", "decode dequantizes blocks first, slower, with the same results")


# x, levels, their row stride, scales, zeros, groups a row, the group, y, lo, hi, K
_PARAMS = ("ptr", "ptr", "i64", "ptr", "ptr", "i64", "i64", "ptr", "i64", "i64", "i64")


_KERNELS = llvm_kernels.CompiledKernels(_compile)


def levels_ir(bits: int, width: int = LANES, prefetch: bool = False) -> list[str]:
    """IR loading the `width` levels of the block at k (row %lrow) as %q, <width x i8> in k order: 4-bit
    levels two to a byte (even k in the low nibble), 8-bit ones a byte each. `prefetch`: ask for the levels
    PREFETCH_BYTES ahead (the rows are contiguous, so past a row's end are the next row's levels; none at
    0)."""
    ahead = llvm_kernels.prefetch("%lp", PREFETCH_BYTES, "%pfp") if prefetch else []
    if bits == 8:
        return ["  %lp = getelementptr i8, ptr %lrow, i64 %k", *ahead, f"  %q = load <{width} x i8>, ptr %lp, align 1"]
    half = width // 2
    interleave = ", ".join(f"i32 {i}, i32 {i + half}" for i in range(half))
    return ["  %kh = lshr i64 %k, 1",
            "  %lp = getelementptr i8, ptr %lrow, i64 %kh", *ahead,
            f"  %lb = load <{half} x i8>, ptr %lp, align 1",
            f"  %lo4 = and <{half} x i8> %lb, {splat(half, 'i8', '15')}",
            f"  %hi4 = lshr <{half} x i8> %lb, {splat(half, 'i8', '4')}",
            f"  %q = shufflevector <{half} x i8> %lo4, <{half} x i8> %hi4, <{width} x i32> <{interleave}>"]


def _table(rounded: bool) -> list[str]:
    """IR of the block's 4-bit table %wt, <16 x float>: entry i the dequantized value of level i, computed
    as `_dequantized` computes each weight (so a level looked up has the bits of one dequantized)."""
    iota = "<" + ", ".join(f"float {i}.0" for i in range(16)) + ">"
    lines = _scale_and_zero(16) + [f"  %td = fsub <16 x float> {iota}, %zs"]
    if not rounded:
        return [*lines, "  %wt = fmul <16 x float> %td, %ss"]
    return [*lines, "  %tv = fmul <16 x float> %td, %ss", *round_bf16_ir(16, "%tv", "%wt")]


def _looked_up() -> list[str]:
    """IR from %q (64 levels) to %w0..%w3, each 16 weights looked up in %wt by one vpermps (AVX-512F)."""
    lines = ["  %qi = zext <64 x i8> %q to <64 x i32>"]
    for a in range(LANES // _VECTOR):
        quarter = ", ".join(f"i32 {a * _VECTOR + i}" for i in range(_VECTOR))
        lines += [f"  %qi{a} = shufflevector <64 x i32> %qi, <64 x i32> poison, <16 x i32> <{quarter}>",
                  f"  %w{a} = call <16 x float> @llvm.x86.avx512.permvar.sf.512(<16 x float> %wt, "
                  f"<16 x i32> %qi{a})"]
    return lines


def _scale_and_zero(width: int) -> list[str]:
    """IR loading the block's group's scale and zero, splatted to `width` lanes as %ss and %zs."""
    return ["  %g = udiv i64 %k, %group",
            "  %sp = getelementptr float, ptr %srow, i64 %g",
            "  %s = load float, ptr %sp, align 4",
            "  %zp = getelementptr float, ptr %zrow, i64 %g",
            "  %z = load float, ptr %zp, align 4",
            f"  %s1 = insertelement <{width} x float> poison, float %s, i64 0",
            f"  %ss = shufflevector <{width} x float> %s1, <{width} x float> poison, <{width} x i32> zeroinitializer",
            f"  %z1 = insertelement <{width} x float> poison, float %z, i64 0",
            f"  %zs = shufflevector <{width} x float> %z1, <{width} x float> poison, <{width} x i32> zeroinitializer"]


def round_bf16_ir(width: int, value: str, out: str) -> list[str]:
    """IR rounding the <width x float> `value` to bf16 (nearest even; NaN to the canonical NaN) as `out`."""
    i32 = lambda v: splat(width, "i32", v)  # noqa: E731
    t = f"<{width} x i32>"
    return [f"  %b = bitcast <{width} x float> {value} to {t}",
            f"  %odd0 = lshr {t} %b, {i32('16')}",
            f"  %odd = and {t} %odd0, {i32('1')}",
            f"  %up0 = add {t} %b, {i32('32767')}",
            f"  %up = add {t} %up0, %odd",
            f"  %r = and {t} %up, {i32('-65536')}",
            f"  %abs = and {t} %b, {i32('2147483647')}",
            f"  %nan = icmp ugt {t} %abs, {i32('2139095040')}",
            f"  %rn = select <{width} x i1> %nan, {t} {i32('2143289344')}, {t} %r",
            f"  {out} = bitcast {t} %rn to <{width} x float>"]


def dequantized_ir(rounded: bool, width: int = LANES) -> list[str]:
    """IR from %q to %wv, <width x float>: (level - zero) * scale with the group's scale and zero at k,
    rounded to bf16 when `rounded`."""
    t = f"<{width} x float>"
    lines = [*_scale_and_zero(width), f"  %qf = uitofp <{width} x i8> %q to {t}", f"  %d = fsub {t} %qf, %zs"]
    if not rounded:
        return [*lines, f"  %wv = fmul {t} %d, %ss"]
    return [*lines, f"  %v = fmul {t} %d, %ss", *round_bf16_ir(width, "%v", "%wv")]


def _ir(bits: int, rounded: bool, method: str) -> str:
    """Per output row n: each block of 64 levels dequantized (4-bit levels by "permute": looked up in a
    16-entry table of the group's values, one vpermps per 16 levels), its four 16-lane quarters multiplied
    with x and added to the four accumulators; then the lane tree."""
    block = levels_ir(bits, prefetch=True)
    if bits == 4 and method == "permute":
        block += [*_table(rounded), *_looked_up()]
    else:
        block += dequantized_ir(rounded)
        for a in range(LANES // _VECTOR):
            quarter = ", ".join(f"i32 {a * _VECTOR + i}" for i in range(_VECTOR))
            block.append(f"  %w{a} = shufflevector <64 x float> %wv, <64 x float> poison, <16 x i32> <{quarter}>")
    params = ("ptr noalias nocapture readonly %x, ptr noalias nocapture readonly %l, i64 %lstride, "
              "ptr noalias nocapture readonly %sc, ptr noalias nocapture readonly %ze, i64 %groups, i64 %group, "
              "ptr noalias nocapture %y, i64 %lo, i64 %hi, i64 %K")
    row_setup = ["  %loff = mul i64 %n, %lstride", "  %lrow = getelementptr i8, ptr %l, i64 %loff",
                 "  %goff = mul i64 %n, %groups", "  %srow = getelementptr float, ptr %sc, i64 %goff",
                 "  %zrow = getelementptr float, ptr %ze, i64 %goff"]
    return vector_product.one_row_function(_name(bits, rounded, method), params, row_setup, block)

"""The 4-bit dequantizer of A16MatMul compiled to one loop (LLVM IR, as the products are), with the bits of
numpy's passes.

A 7B w4 binary on the host dequantizes, for every token, each projection its cache does not hold: some
5G weights. `dequantize._dequantize_block` does it in eight numpy passes (unpack the nibbles, widen, subtract
the zero point, multiply by the scale, then five integer passes that round to bf16), each reading and
writing the whole block. Compiled, the same arithmetic is one pass over the packed bytes: sixteen levels
at a time widened, offset, scaled and rounded in a vector register, then stored.

Same bits: for every weight, float32(level) - float32(zero), times the float32 scale, in float32 (no
fast-math flag: LLVM neither contracts nor reorders), then round-to-nearest-even on the bit pattern with a
NaN made the canonical bf16 NaN, as `formats.round_bf16_inplace` does. tests/test_compiled_dequant.py
compares the two bit for bit, non-finite scales included.

Which weights take it: bf16 rounding, float32 scales, a group of a multiple of 16, levels two to a byte (the
binary's 4-bit weights) or one (TopOp's levels, 8-bit weights). Only a 4-bit weight of `MIN_WEIGHTS` or more
makes the host path leave it quantized and dequantize it as products read it (`wanted`); a whole weight
dequantized once (the host's cache of smaller projections, the TopOp interpreter in a build's checks) takes
it at any size (`ready`).
Its machine code is compiled once per process with the products' (kernel_cache.py keeps it between
processes). Where llvmlite cannot build it, the numpy passes run: slower, same bits.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from llmbuild.numerics import llvm_kernels
from llmbuild.numerics.addresses import address
from llmbuild.numerics.levels_product import dequantized_ir, levels_ir
from llmbuild.numerics.llvm_kernels import splat

# The smallest weight (elements) the host path leaves quantized, dequantizing it block by block as each
# product reads it: a 1.5B model's MLP projections (1536 x 8960) and up.
MIN_WEIGHTS = 1 << 23
_VECTOR = 16  # levels per step: one <16 x float> register



def takes(attrs: dict[str, Any], scale_dtype: np.dtype) -> bool:
    """Whether the kernel computes a weight quantized under `attrs` (levels two to a byte or one, bf16
    rounding, float32 scales, a group of a multiple of 16)."""
    group = int(attrs.get("q_group_size") or 0)
    return (attrs.get("dequant_dtype") in ("bf16", None) and scale_dtype == np.float32 and group > 0
            and group % _VECTOR == 0)


def wanted(weights: int, attrs: dict[str, Any], scale_dtype: np.dtype) -> bool:
    """Whether a 4-bit weight of `weights` elements is left quantized and dequantized as products read it."""
    return (weights >= MIN_WEIGHTS and bool(attrs.get("packed")) and attrs.get("dequant_dtype") == "bf16"
            and takes(attrs, scale_dtype) and kernel() is not None)


def ready(attrs: dict[str, Any], scale_dtype: np.dtype) -> bool:
    """Whether a whole weight quantized under `attrs`, of any size, is dequantized by the kernel: a 1.5B
    model's attention projections into the host's cache (a seventh of numpy's passes' time), the TopOp
    interpreter's levels (one to a byte) in a build's checks."""
    return takes(attrs, scale_dtype) and kernel() is not None


def kernel(two: bool = True, rounded: bool = True, bits: bool = False) -> Callable[..., None] | None:
    """The compiled dequantizer for levels two to a byte or one, rounded to bf16 or not: `(levels*, scale*,
    zero*, groups_per_row, group, out*, rows, K)` over C-contiguous u8 levels [rows, K/2] or [rows, K], scale
    and zero f32 [rows, K/g] and out f32 [rows, K] (`bits`: the rounded values' bf16 bit patterns, u16
    [rows, K]), compiled (with the others) on first use; None where it cannot be built."""
    return _KERNELS.get((two, rounded, bits))


def dequantize_into(levels: np.ndarray, scale: np.ndarray, zero: np.ndarray, group: int, out: np.ndarray,
                    rounded: bool = True) -> None:
    """`out` [r, K] = (level - zero) * scale, rounded to bf16 when `rounded` (a bf16 `dequant_dtype`), the
    levels two to a byte (even k in the low nibble; `levels` [r, K/2]) or one ([r, K]). A uint16 `out` takes
    the rounded values' bf16 bit patterns (exact: the rounding left nothing below them), half the bytes a
    product then reads."""
    k = out.shape[1]
    two = levels.shape[1] * 2 == k
    bits = out.dtype == np.uint16
    run = kernel(two, rounded, bits)
    assert run is not None and group % _VECTOR == 0 and (two or levels.shape[1] == k) and (rounded or not bits), \
        "compiled_dequant.dequantize_into: check takes() first"
    stored = np.uint16 if bits else np.float32
    target = out if out.flags.c_contiguous and out.dtype == stored else np.empty(out.shape, stored)
    rows = target.shape[0]
    if rows == 0:
        return
    packed = np.ascontiguousarray(levels, dtype=np.uint8)
    scale = np.ascontiguousarray(scale, dtype=np.float32)
    zero = np.ascontiguousarray(zero, dtype=np.float32)
    run(address(packed), address(scale), address(zero), k // group, group, address(target), rows, k)
    if target is not out:
        out[...] = target


def _compile() -> dict[tuple[bool, bool, bool], Callable[..., None] | None]:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    return llvm_kernels.compile_functions(
        "".join(_ir(*kind) for kind in _KINDS), {kind: _name(*kind) for kind in _KINDS},
        ctypes.CFUNCTYPE(None, ptr, ptr, ptr, i64, i64, ptr, i64, i64),
        "the compiled dequantizer", "4-bit weights are dequantized by numpy, slower, with the same results")


# (levels two to a byte, rounded to bf16, stored as bit patterns): the bit patterns only of rounded values
_KINDS = [(two, rounded, bits) for two in (True, False) for rounded in (True, False) for bits in (False, True)
          if rounded or not bits]


def _name(two: bool, rounded: bool, bits: bool) -> str:
    return f"dequantize_{'w4' if two else 'u8'}{'_bf16' if rounded else ''}{'_bits' if bits else ''}"


def _ir(two: bool, rounded: bool, bits: bool) -> str:
    """Per row, per 16 levels (8 bytes of nibbles widened in k order, or 16 bytes): minus the group's zero,
    times its scale, rounded to bf16, stored (as the float, or its top half: the bf16 bit pattern)."""
    element = "i16" if bits else "float"
    if bits:
        store = ["  %wi = bitcast <16 x float> %wv to <16 x i32>",
                 f"  %wh = lshr <16 x i32> %wi, {splat(_VECTOR, 'i32', '16')}",
                 "  %wb = trunc <16 x i32> %wh to <16 x i16>",
                 "  %op = getelementptr i16, ptr %orow, i64 %k",
                 f"  store <{_VECTOR} x i16> %wb, ptr %op, align 2"]
    else:
        store = ["  %op = getelementptr float, ptr %orow, i64 %k", f"  store <{_VECTOR} x float> %wv, ptr %op, align 4"]
    block = "\n".join([
        *levels_ir(4 if two else 8, _VECTOR),
        *dequantized_ir(rounded, _VECTOR),  # levels_product's arithmetic, 16 lanes at a time
        *store,
    ])
    return f"""
define void @{_name(two, rounded, bits)}(ptr noalias nocapture readonly %l, ptr noalias nocapture readonly %sc,
                                ptr noalias nocapture readonly %ze, i64 %groups, i64 %group,
                                ptr noalias nocapture %out, i64 %rows, i64 %K) {{
entry:
  %half = lshr i64 %K, 1
  %none = icmp sle i64 %rows, 0
  br i1 %none, label %done, label %row
row:
  %ri = phi i64 [ 0, %entry ], [ %ri1, %rowend ]
  %loff = mul i64 %ri, {"%half" if two else "%K"}
  %lrow = getelementptr i8, ptr %l, i64 %loff
  %goff = mul i64 %ri, %groups
  %srow = getelementptr float, ptr %sc, i64 %goff
  %zrow = getelementptr float, ptr %ze, i64 %goff
  %ooff = mul i64 %ri, %K
  %orow = getelementptr {element}, ptr %out, i64 %ooff
  br label %kloop
kloop:
  %k = phi i64 [ 0, %row ], [ %knext, %kloop ]
{block}
  %knext = add i64 %k, {_VECTOR}
  %more = icmp slt i64 %knext, %K
  br i1 %more, label %kloop, label %rowend
rowend:
  %ri1 = add i64 %ri, 1
  %again = icmp slt i64 %ri1, %rows
  br i1 %again, label %row, label %done
done:
  ret void
}}
"""


_KERNELS = llvm_kernels.CompiledKernels(_compile)

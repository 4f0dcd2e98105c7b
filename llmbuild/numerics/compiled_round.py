"""The device's store of a bf16 result (round float32 to bf16, nearest even), compiled to one pass.

Every op of a bf16 net ends in this rounding, on the device simulator and on the host path alike, so a
decode step of SmolLM2-135M rounds some 600 small arrays. In numpy the rounding is five integer passes and
a NaN scan, each a call of a few microseconds: a fifth of a host decode step went to them. Compiled (LLVM
IR, as the products are: numerics/vector_product.py), it is one loop over the values, sixteen at a time,
then one at a time for the rest.

Same bits as `formats.round_to(x, "bf16")`: the IR is levels_product's rounding (round-to-nearest-even on
the bit pattern, NaN made the canonical NaN), the one the compiled dequantizer applies to its weights.
tests/test_compiled_round.py compares them bit for bit, non-finite values, odd lengths and empty arrays
included. Where llvmlite cannot build it, `formats.round_bf16_inplace` runs on a copy: slower, same bits.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

from llmbuild.numerics import llvm_kernels
from llmbuild.numerics.addresses import address
from llmbuild.numerics.formats import round_bf16_inplace
from llmbuild.numerics.levels_product import round_bf16_ir

_VECTOR = 16


def rounded_bf16(x: np.ndarray) -> np.ndarray:
    """A new C-contiguous float32 array of `x`'s shape holding `round_to(x, "bf16")`; `x` is unchanged (it
    may be a view of an operand)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    run = kernel()
    if run is None:
        return round_bf16_inplace(x.copy())
    out = np.empty_like(x)
    run(address(x), address(out), x.size)
    return out


def kernel() -> Callable[[int, int, int], None] | None:
    """`(x*, y*, n)`: y[:n] = x[:n] rounded to bf16 (float32 values); None when it cannot be built."""
    return _KERNELS.get("bf16")


def _loop(name: str, width: int) -> str:
    """A function rounding %n values from %x into %y, `width` at a time (%n a multiple of it)."""
    t = f"<{width} x float>"
    return f"""
define void @{name}(ptr noalias nocapture readonly %x, ptr noalias nocapture %y, i64 %n) {{
entry:
  %none = icmp sle i64 %n, 0
  br i1 %none, label %done, label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %xp = getelementptr float, ptr %x, i64 %i
  %v = load {t}, ptr %xp, align 4
{chr(10).join(round_bf16_ir(width, "%v", "%out"))}
  %yp = getelementptr float, ptr %y, i64 %i
  store {t} %out, ptr %yp, align 4
  %next = add i64 %i, {width}
  %more = icmp slt i64 %next, %n
  br i1 %more, label %loop, label %done
done:
  ret void
}}
"""


def _ir() -> str:
    return _loop("round_bf16_vectors", _VECTOR) + _loop("round_bf16_values", 1) + f"""
define void @round_bf16(ptr noalias nocapture readonly %x, ptr noalias nocapture %y, i64 %n) {{
entry:
  %whole = and i64 %n, -{_VECTOR}
  call void @round_bf16_vectors(ptr %x, ptr %y, i64 %whole)
  %xt = getelementptr float, ptr %x, i64 %whole
  %yt = getelementptr float, ptr %y, i64 %whole
  %rest = sub i64 %n, %whole
  call void @round_bf16_values(ptr %xt, ptr %yt, i64 %rest)
  ret void
}}
"""


def _compile() -> dict[str, Callable[..., None] | None]:
    return llvm_kernels.compile_functions(
        _ir(), {"bf16": "round_bf16"}, ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64),
        "the compiled bf16 rounding", "results are rounded by numpy, slower, with the same bits")


_KERNELS = llvm_kernels.CompiledKernels(_compile)

"""The arithmetic of a one-row product (a decode step's projections, the lm_head): defined here, compiled once.

A decode step multiplies one activation row by every weight matrix of the model: it reads each weight
once and does one multiply-add per weight, so its speed is the speed of reading the weights. OpenBLAS's
matrix-vector kernel reads them as float32, twice the bytes of a bf16 checkpoint's, and its order of sums
is OpenBLAS's own (its kernel for this CPU, its FMA). The device's one-row product is defined here
instead, for every weight type alike:

    each output y[n] of x [K] times w [N, K]: K is cut into blocks of LANES = 64 (the last one padded with
    zeros), lane j sums the products x[k] * w[n, k] of k = j (mod 64) block after block, each product and
    each sum rounded to float32 (no fused multiply-add); then the 64 lanes are added in a fixed tree:
    lanes j and j + 16, j + 32, j + 48 as (l0 + l1) + (l2 + l3), then halves 8, 4, 2, 1.

That is what a vector unit of 16 float32 lanes with four accumulators computes, so the compiled kernel
below reads bf16, f16 or f32 weights as they are stored and widens them in registers: SmolLM2-135M's
bf16 weights are read in half the bytes of OpenBLAS's float32 (docs/design.md, "Decisions and why"). Every
output is one thread's, whole, so splitting the rows over threads changes no bit, and neither does the
CPU: the kernel's vectors are explicit LLVM IR, the same lane arithmetic on AVX2 or AVX-512.

`reference` computes the same bits in numpy (tests/test_vector_product.py compares them on every weight
type, odd K included); it also runs wherever the kernel cannot (no llvmlite, K not a multiple of 64).
The kernel is LLVM IR written here and compiled with llvmlite (numba's compiler library, already a
runtime dependency) in about 0.1 s the first time a process needs it; no fast-math flag is set, so LLVM
may neither reassociate nor contract the arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from llmbuild.numerics import llvm_kernels, team
from llmbuild.numerics.addresses import address
from llmbuild.numerics.formats import bf16_bits_to_f32
from llmbuild.numerics.parallel import row_spans

Key = TypeVar("Key")

LANES = 64
_VECTOR = 16  # lanes per LLVM vector; LANES / _VECTOR accumulators
# Weights above which a product's rows are split over the worker threads (a vocabulary table, a 7B
# projection): below it a thread hand-off costs more than the product (SmolLM2's 1536 x 576: 0.05 ms).
PARALLEL_WEIGHTS = 1 << 22
# With team.py's workers, whose hand-off costs microseconds: SmolLM2's 192 x 576 k and v projections and up
# (its decode step's products 2.5 ms quicker than from 2^18 weights, 27.4 against 29.7 ms, on a 2-core VM).
TEAM_WEIGHTS = 1 << 16

# How far ahead of the block it multiplies the one-row kernel asks for weight bytes (0: not at all). A
# decode step's small products read weights the cache no longer holds, too few for the hardware's
# prefetcher to ramp up: SmolLM2 bf16's products took 26.4-26.6 ms a token without, 24.2-25.2 with 1 KiB
# (decode 25.9-26.1 -> 26.9-27.6 tokens/s, alternating runs of benchmarks/host_ops.py smollm2_135m_bf16 on a
# 2-core Xeon VM; against the code before it, 26.7 -> 29.6-29.7, and the 1.5B's bf16 lm_head 21.3-21.4 ->
# 18.4-18.7 ms a token); 2 KiB was no better, 8 KiB worse. The same weights back to back in a loop gained
# nothing.
PREFETCH_BYTES = 1024

# Storage type -> (LLVM element type, how 16 of them become <16 x float>)
WIDEN = {
    "f32": ("float", None),
    "bf16": ("i16", "zext <16 x i16> {v} to <16 x i32>\n  {t}s = shl <16 x i32> {t}z, {sixteen}\n"
                    "  {t} = bitcast <16 x i32> {t}s to <16 x float>"),
    "f16": ("half", "fpext <16 x half> {v} to <16 x float>"),
}
_NUMPY_STORAGE = {np.dtype(np.float32): "f32", np.dtype(np.uint16): "bf16", np.dtype(np.float16): "f16"}


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y [N] = the one-row product of x [K] and w [N, K] (float32 values), in numpy, with the kernel's bits."""
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    n, k = w.shape
    blocks = -(-k // LANES)
    padded = np.zeros(blocks * LANES, dtype=np.float32)
    padded[:k] = x
    out = np.empty(n, dtype=np.float32)
    step = max(1, (1 << 20) // max(1, blocks * LANES))  # rows at a time: bounded temporaries
    with np.errstate(all="ignore"):  # inf and NaN propagate, as in the kernel, without a warning per call
        for lo in range(0, n, step):
            _rows_into(w, padded, lo, min(n, lo + step), out)
    return out


def _rows_into(w: np.ndarray, padded: np.ndarray, lo: int, hi: int, out: np.ndarray) -> None:
    """out[lo:hi] = the product of rows lo:hi of w with the zero-padded x."""
    rows = np.zeros((hi - lo, padded.size), dtype=np.float32)
    rows[:, : w.shape[1]] = w[lo:hi]
    products = (rows * padded).reshape(hi - lo, -1, LANES)
    lanes = np.zeros((hi - lo, LANES), dtype=np.float32)
    for b in range(products.shape[1]):  # one block after the other: each lane's sums in k order
        lanes += products[:, b]
    out[lo:hi] = tree_sum(lanes)


def tree_sum(lanes: np.ndarray) -> np.ndarray:
    """[..., 64] lanes -> [...]: (l[j] + l[j+16]) + (l[j+32] + l[j+48]), then halves of 8, 4, 2, 1."""
    v = (lanes[..., 0:16] + lanes[..., 16:32]) + (lanes[..., 32:48] + lanes[..., 48:64])
    while v.shape[-1] > 1:
        half = v.shape[-1] // 2
        v = v[..., :half] + v[..., half:]
    return v[..., 0]


def product(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out [N] (float32) = the one-row product of x [K] (float32) and w [N, K], w as stored: float32, bf16 bit
    patterns (uint16) or float16. Compiled when it can be, else `reference`; the same bits either way."""
    n, k = w.shape
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    storage = _NUMPY_STORAGE.get(w.dtype, "")
    run = kernel(storage) if k % LANES == 0 and k > 0 else None
    if run is None or not w.flags.c_contiguous or not out.flags.c_contiguous or out.dtype != np.float32:
        values = bf16_bits_to_f32(w) if w.dtype == np.uint16 else w
        out[...] = reference(x, values.astype(np.float32, copy=False))
        return
    xp, wp, yp, row = address(x), address(w), address(out), w.strides[0]
    span = _KERNELS.get(("span", storage))
    row_spans(n, n * k, parallel_weights(), lambda lo, hi: run(xp, wp, yp, lo, hi, k, row),
              (span, (xp, wp, yp, k, row)))


def parallel_weights() -> int:
    """Weights above which a one-row product's rows are split over the cores: PARALLEL_WEIGHTS through the
    thread pool, TEAM_WEIGHTS through team.py's workers."""
    return TEAM_WEIGHTS if team.available() else PARALLEL_WEIGHTS


# ---- the compiled kernel ---------------------------------------------------------------------------

def kernel(storage: str) -> Callable[..., None] | None:
    """The compiled product for weights stored as `storage` ("f32", "bf16", "f16"): `(x*, w*, y*, row_lo,
    row_hi, K, row_stride_bytes)`, computing y[row_lo:row_hi]; None when it cannot be built."""
    return _KERNELS.get(storage)


_PARAMS = ("ptr", "ptr", "ptr", "i64", "i64", "i64", "i64")  # x, w, y, lo, hi, K, w's row stride


def _compile() -> dict[Any, Any]:
    spans, symbols, signatures = team.with_spans({s: f"row_product_{s}" for s in WIDEN}, _PARAMS, 3)
    return llvm_kernels.compile_functions("\n".join(_ir(storage) for storage in WIDEN) + spans
                                          + llvm_kernels.PREFETCH_DECLARATION, symbols, signatures,
                             "the compiled one-row product", "decode runs on numpy, slower, with the same results")


_KERNELS = llvm_kernels.CompiledKernels(_compile)


def widened_load(storage: str, name: str, row: str, k: str) -> list[str]:
    """IR loading 16 weights of type `storage` at element `k` of the row at pointer `row` as `name`, a
    <16 x float> (16-bit types widened in registers)."""
    element, widen = WIDEN[storage]
    lines = [f"  {name}p = getelementptr {element}, ptr {row}, i64 {k}"]
    if widen is None:
        return [*lines, f"  {name} = load <16 x float>, ptr {name}p, align 4"]
    lines.append(f"  {name}raw = load <16 x {element}>, ptr {name}p, align 2")
    first, _, rest = widen.partition("\n")
    if rest:  # bf16: zero-extend, shift into the top half, reinterpret
        sixteen = "<" + ", ".join(["i32 16"] * _VECTOR) + ">"
        return [*lines, f"  {name}z = " + first.format(v=f"{name}raw"), rest.format(t=name, sixteen=sixteen)]
    return [*lines, f"  {name} = " + first.format(v=f"{name}raw")]


def lane_tree(accumulators: list[str], name: str) -> str:
    """IR adding four <16 x float> accumulators (lanes j, j+16, j+32, j+48) by the fixed tree into the float
    `%name`: (a0 + a1) + (a2 + a3), then halves of 8, 4, 2, 1."""
    a0, a1, a2, a3 = accumulators

    def halves(width: int, part: str, src: str) -> str:
        lo = ", ".join(f"i32 {i}" for i in range(width))
        hi = ", ".join(f"i32 {i + width}" for i in range(width))
        pair = f"<{2 * width} x float> {src}, <{2 * width} x float> poison, <{width} x i32>"
        return (f"  %{part}l = shufflevector {pair} <{lo}>\n  %{part}h = shufflevector {pair} <{hi}>\n"
                f"  %{part} = fadd <{width} x float> %{part}l, %{part}h")

    return "\n".join([f"  %{name}01 = fadd <16 x float> {a0}, {a1}", f"  %{name}23 = fadd <16 x float> {a2}, {a3}",
                      f"  %{name}16 = fadd <16 x float> %{name}01, %{name}23",
                      halves(8, f"{name}8", f"%{name}16"), halves(4, f"{name}4", f"%{name}8"),
                      halves(2, f"{name}2", f"%{name}4"),
                      f"  %{name}e0 = extractelement <2 x float> %{name}2, i32 0",
                      f"  %{name}e1 = extractelement <2 x float> %{name}2, i32 1",
                      f"  %{name} = fadd float %{name}e0, %{name}e1"])


def lane_multiply_adds(xrow: str, k: str, weights: list[str], accumulators: list[str], results: list[str],
                       tag: str) -> list[str]:
    """IR of one block's lanes: results[a] = accumulators[a] + x[k + 16a : k + 16a + 16] * weights[a], for
    a = 0..3, x read from the float row at pointer `xrow`; the product rounded, then the sum (no FMA)."""
    lines = []
    for a, (weight, accumulator, result) in enumerate(zip(weights, accumulators, results, strict=True)):
        v = f"%{tag}x{a}"
        lines += [f"  {v}k = add i64 {k}, {a * _VECTOR}",
                  f"  {v}p = getelementptr float, ptr {xrow}, i64 {v}k",
                  f"  {v} = load <16 x float>, ptr {v}p, align 4",
                  f"  {v}m = fmul <16 x float> {v}, {weight}",
                  f"  {result} = fadd <16 x float> {accumulator}, {v}m"]
    return lines


def one_row_function(name: str, params: str, row_setup: list[str], block: list[str]) -> str:
    """LLVM IR of a one-row product `name(params)` over output rows [%lo, %hi) of K = %K: per row n,
    `row_setup` (pointers of row n), then blocks of 64 k (`block` computes the block's four weight vectors
    %w0..%w3 at %k), each added lane by lane to four accumulators, then the lane tree stored at %y[n]."""
    accumulators = [f"%a{a}" for a in range(LANES // _VECTOR)]
    results = [f"%na{a}" for a in range(LANES // _VECTOR)]
    phis = [f"  %a{a} = phi <16 x float> [ zeroinitializer, %row ], [ %na{a}, %kloop ]"
            for a in range(LANES // _VECTOR)]
    weights = [f"%w{a}" for a in range(LANES // _VECTOR)]
    body = "\n".join([*phis, *block, *lane_multiply_adds("%x", "%k", weights, accumulators, results, "")])
    setup = "\n".join(row_setup)
    return f"""
define void @{name}({params}) {{
entry:
  %none = icmp sge i64 %lo, %hi
  br i1 %none, label %done, label %row
row:
  %n = phi i64 [ %lo, %entry ], [ %n1, %rowend ]
{setup}
  br label %kloop
kloop:
  %k = phi i64 [ 0, %row ], [ %knext, %kloop ]
{body}
  %knext = add i64 %k, {LANES}
  %more = icmp slt i64 %knext, %K
  br i1 %more, label %kloop, label %rowend
rowend:
{row_end(results)}
"""


def row_end(accumulators: list[str]) -> str:
    """IR ending a one-row function's row n: the four accumulators' lane tree stored at %y[n], then the next
    row (back to `row`) or the end of the function."""
    return f"""{lane_tree(accumulators, "sum")}
  %yp = getelementptr float, ptr %y, i64 %n
  store float %sum, ptr %yp, align 4
  %n1 = add i64 %n, 1
  %rows = icmp slt i64 %n1, %hi
  br i1 %rows, label %row, label %done
done:
  ret void
}}"""


def _ir(storage: str) -> str:
    """LLVM IR of the product for one storage type: per output row, 4 accumulators of <16 x float> (lanes
    j, j+16, j+32, j+48 of a block of 64), each block's weights loaded as stored and widened."""
    block = []
    if PREFETCH_BYTES:  # each cache line of the block's weights, PREFETCH_BYTES further on
        size = next(dtype.itemsize for dtype, name in _NUMPY_STORAGE.items() if name == storage)
        block += [f"  %kb = mul i64 %k, {size}", "  %wb = getelementptr i8, ptr %wrow, i64 %kb"]
        for line in range(LANES * size // 64):
            block += llvm_kernels.prefetch("%wb", PREFETCH_BYTES + 64 * line, f"%pf{line}")
    for a in range(LANES // _VECTOR):
        block += [f"  %wk{a} = add i64 %k, {a * _VECTOR}", *widened_load(storage, f"%w{a}", "%wrow", f"%wk{a}")]
    params = ("ptr noalias nocapture readonly %x, ptr noalias nocapture readonly %w, ptr noalias nocapture %y, "
              "i64 %lo, i64 %hi, i64 %K, i64 %stride")
    return one_row_function(f"row_product_{storage}", params,
                            ["  %offset = mul i64 %n, %stride", "  %wrow = getelementptr i8, ptr %w, i64 %offset"],
                            block)

"""Whether this CPU's bf16 dot-product instructions compute the host's defined product, and how fast:

    python benchmarks/bf16_instructions.py [--lanes 20000] [--tiles 20]

The host's products (numerics/vector_product.py) are sums in a defined order, each product and each sum
rounded to float32. In a bf16 net both operands are bf16 values, so every product is exact and only the sums
round: an instruction that adds exact bf16 products one at a time, each sum rounded to nearest even, could
compute the same bits faster. Two candidates, each compared output by output with exact arithmetic
(fractions) under several readings of what it does:
- AVX512-BF16's `vdpbf16ps` (16 float32 lanes, two bf16 pairs each): its pseudocode adds the odd pair's
  product, then the even pair's, each sum rounded;
- AMX-BF16's `tdpbf16ps` (a 16 x 16 float32 tile += 16 x 32 by 32 x 16 bf16): its pseudocode adds the even
  then the odd product of each pair, 16 pairs in order.
A quarter of the lanes (a third of the tiles) are made to cancel (equal and opposite products), where
the readings differ most. Then what AMX does compute exactly: its byte products (AMX-INT8's `tdpbssd`,
`tdpbsud`, `tdpbusd`, `tdpbuud`: s signed, u unsigned bytes, A's then B's, into int32) against numpy's
integer sums, and `tdpbf16ps` on integers of at most 8 bits (benchmarks/integer_products.py weighs a product
defined that way). Then the throughput of `vdpbf16ps`, a fused multiply-add and the defined multiply then
add, on one core, independent accumulators in registers, operands loaded from L1 each step, and of the tile
products (four accumulator tiles held across 32 steps, operands from L1): multiply-adds per nanosecond.
Rows for an instruction this CPU lacks say so. Nothing here changes a build.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmbuild.numerics import llvm_kernels  # noqa: E402
from llmbuild.numerics.formats import bf16_bits_to_f32, f32_to_bf16_bits  # noqa: E402

_DP = "declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)\n"
_FMA = "declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)\n"
# AMX's tile products: bf16 pairs into float32, and bytes (s: signed, u: unsigned; A's then B's) into int32.
TILE_OPS = ("tdpbf16ps", "tdpbssd", "tdpbsud", "tdpbusd", "tdpbuud")
_TILE_MACS = {op: 16 * 16 * (32 if op == "tdpbf16ps" else 64) for op in TILE_OPS}


def _amx(op: str) -> str:
    return f"""declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)
declare x86_amx @llvm.x86.{op}.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)
declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)
"""


def exact(bits: np.ndarray) -> list[Fraction]:
    return [Fraction(float(v)) for v in bf16_bits_to_f32(bits).reshape(-1)]


def rounded(value: Fraction) -> Fraction:
    """`value` rounded to float32, nearest even (through float64: exact for the sums compared here, whose
    terms have at most 16 significant bits and a few binades between them)."""
    return Fraction(float(np.float32(float(value))))


def _function(ir: str, name: str, *args: type) -> object:
    engine = llvm_kernels.compile_ir(ir)
    llvm_kernels.keep(engine)
    return ctypes.CFUNCTYPE(None, *args)(engine.get_function_address(name))


def vdpbf16ps_rows(lanes: int, rng: np.random.Generator) -> list[tuple[str, str, int, int]]:
    p = ctypes.c_void_p
    run = _function(_DP + """define void @dp(ptr %a, ptr %b, ptr %c) {
  %cv = load <16 x float>, ptr %c, align 4
  %av = load <32 x bfloat>, ptr %a, align 2
  %bv = load <32 x bfloat>, ptr %b, align 2
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %cv, <32 x bfloat> %av, <32 x bfloat> %bv)
  store <16 x float> %r, ptr %c, align 4
  ret void
}""", "dp", p, p, p)
    readings = {"odd pair's product, then the even's, each sum rounded (its pseudocode)": 0,
                "even pair's product, then the odd's, each sum rounded": 0, "one rounding per pair": 0}
    done = 0
    for t in range(-(-lanes // 16)):
        a = f32_to_bf16_bits(rng.standard_normal(32) * (1e-3, 1.0, 1e3)[t % 3])
        b = f32_to_bf16_bits(rng.standard_normal(32))
        if t % 4 == 1:  # equal and opposite products: cancellation
            a[1::2], b[1::2] = a[0::2], b[0::2] ^ 0x8000
        c = (rng.standard_normal(16) * (10.0, 1e-3, 1.0)[t % 3]).astype(np.float32)
        got = c.copy()
        run(a.ctypes.data, b.ctypes.data, got.ctypes.data)
        ea, eb, ec = exact(a), exact(b), [Fraction(float(v)) for v in c]
        for i in range(16):
            even, odd = ea[2 * i] * eb[2 * i], ea[2 * i + 1] * eb[2 * i + 1]
            want = {0: rounded(rounded(ec[i] + odd) + even), 1: rounded(rounded(ec[i] + even) + odd),
                    2: rounded(ec[i] + even + odd)}
            for k, key in enumerate(readings):
                readings[key] += Fraction(float(got[i])) == want[k]
        done += 16
    return [("vdpbf16ps", reading, equal, done) for reading, equal in readings.items()]


def _tile_state() -> bool:
    """Whether the kernel grants this process AMX's tile state (arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA))."""
    return ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18) == 0


def _tile_op(op: str) -> object:
    """C (16 x 16 32-bit) += A (16 rows of 64 bytes) times B (16 rows of 64 bytes, AMX's layout) by `op`."""
    p = ctypes.c_void_p
    return _function(_amx(op) + f"""define void @amx(ptr %a, ptr %b, ptr %c) {{
  %ct = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %c, i64 64)
  %at = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %a, i64 64)
  %bt = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %b, i64 64)
  %r = call x86_amx @llvm.x86.{op}.internal(i16 16, i16 64, i16 64, x86_amx %ct, x86_amx %at, x86_amx %bt)
  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %c, i64 64, x86_amx %r)
  ret void
}}""", "amx", p, p, p)


def tdpbf16ps_rows(tiles: int, rng: np.random.Generator) -> list[tuple[str, str, int, int]]:
    if not _tile_state():
        return [("tdpbf16ps", "the kernel refused the tile state (arch_prctl)", 0, 0)]
    run = _tile_op("tdpbf16ps")
    readings = {"even then odd product of each pair, each sum rounded (its pseudocode)": 0,
                "odd then even, each sum rounded": 0, "one rounding per pair": 0, "one rounding per tile": 0}
    done = 0
    for t in range(tiles):
        a = f32_to_bf16_bits(rng.standard_normal((16, 32)) * (1.0, 1e-3, 1e3)[t % 3])
        b = f32_to_bf16_bits(rng.standard_normal((32, 16)))
        if t % 3 == 1:
            a[:, 1::2], b[1::2] = a[:, 0::2], b[0::2] ^ 0x8000
        c = (rng.standard_normal((16, 16)) * (10.0, 1e-3)[t % 2]).astype(np.float32)
        got = c.copy()
        b_pairs = np.ascontiguousarray(b.reshape(16, 2, 16).transpose(0, 2, 1))  # [k / 2][n][2]: AMX's layout
        run(a.ctypes.data, b_pairs.ctypes.data, got.ctypes.data)
        ea, eb = np.array(exact(a), dtype=object).reshape(16, 32), np.array(exact(b), dtype=object).reshape(32, 16)
        for m in range(16):
            for n in range(16):
                products = [ea[m, k] * eb[k, n] for k in range(32)]
                start = Fraction(float(c[m, n]))
                sums = [start, start, start]
                for i in range(16):
                    sums[0] = rounded(rounded(sums[0] + products[2 * i]) + products[2 * i + 1])
                    sums[1] = rounded(rounded(sums[1] + products[2 * i + 1]) + products[2 * i])
                    sums[2] = rounded(sums[2] + products[2 * i] + products[2 * i + 1])
                want = [*sums, rounded(start + sum(products))]
                for k, key in enumerate(readings):
                    readings[key] += Fraction(float(got[m, n])) == want[k]
                done += 1
    return [("tdpbf16ps", reading, equal, done) for reading, equal in readings.items()]


def integer_tile_rows(tiles: int, rng: np.random.Generator) -> list[tuple[str, str, int, int]]:
    """The byte products against numpy's int64 sums, and `tdpbf16ps` on integers of at most 8 bits (each
    product and every partial sum of a tile is then an integer float32 holds exactly, so any order and any
    rounding gives the exact sum: the question is whether this instruction keeps every bit of one)."""
    if not _tile_state():
        return [("tiles", "the kernel refused the tile state (arch_prctl)", 0, 0)]
    rows = []
    for op in TILE_OPS[1:]:
        run, equal = _tile_op(op), 0
        for _ in range(tiles):
            a = rng.integers(-128, 128, (16, 64)) if op[4] == "s" else rng.integers(0, 256, (16, 64))
            b = rng.integers(-128, 128, (64, 16)) if op[5] == "s" else rng.integers(0, 256, (64, 16))
            c = rng.integers(-(1 << 20), 1 << 20, (16, 16)).astype(np.int32)
            got = c.copy()
            a_bytes = a.astype(np.int8 if op[4] == "s" else np.uint8)  # named: the call reads their memory
            b_quads = np.ascontiguousarray(b.reshape(16, 4, 16).transpose(0, 2, 1))  # [k / 4][n][4]
            b_bytes = b_quads.astype(np.int8 if op[5] == "s" else np.uint8)
            run(a_bytes.ctypes.data, b_bytes.ctypes.data, got.ctypes.data)
            equal += int(np.sum(got.astype(np.int64) == c.astype(np.int64) + a @ b))
        rows.append((op, "the exact integer sum", equal, 256 * tiles))
    run, equal = _tile_op("tdpbf16ps"), 0
    for _ in range(tiles):
        a, b = rng.integers(-256, 257, (16, 32)), rng.integers(-256, 257, (32, 16))
        got = np.zeros((16, 16), dtype=np.float32)
        a_bits = f32_to_bf16_bits(a.astype(np.float32))
        b_pairs = np.ascontiguousarray(f32_to_bf16_bits(b.astype(np.float32)).reshape(16, 2, 16).transpose(0, 2, 1))
        run(a_bits.ctypes.data, b_pairs.ctypes.data, got.ctypes.data)
        equal += int(np.sum(got.astype(np.int64) == a @ b))
    rows.append(("tdpbf16ps", "integer operands of at most 8 bits (|v| <= 256): the exact sum", equal, 256 * tiles))
    return rows


def tile_throughput(op: str, steps: int = 32, calls: int = 20000) -> float:
    """Multiply-adds per ns of `op` on one core: four accumulator tiles (a 2 x 2 block) held across `steps`
    products, each step's two A and two B tiles loaded from L1."""
    lines = []
    for c in range(4):
        lines += [f"  %cp{c} = getelementptr i8, ptr %c, i64 {c * 1024}",
                  f"  %c{c}_0 = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %cp{c}, i64 64)"]
    for s in range(steps):
        for t, base in (("a0", 0), ("a1", 1024), ("b0", 2048), ("b1", 3072)):
            lines += [f"  %{t}p{s} = getelementptr i8, ptr %ab, i64 {base + (s % 2) * 4096}",
                      f"  %{t}_{s} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %{t}p{s}, i64 64)"]
        for c, (a, b) in enumerate((("a0", "b0"), ("a0", "b1"), ("a1", "b0"), ("a1", "b1"))):
            lines.append(f"  %c{c}_{s + 1} = call x86_amx @llvm.x86.{op}.internal(i16 16, i16 64, i16 64, "
                         f"x86_amx %c{c}_{s}, x86_amx %{a}_{s}, x86_amx %{b}_{s})")
    for c in range(4):
        lines.append(f"  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %cp{c}, i64 64, "
                     f"x86_amx %c{c}_{steps})")
    ir = _amx(op) + "define void @block(ptr %ab, ptr %c) {\n" + "\n".join(lines) + """
  ret void
}
define void @loop(ptr %ab, ptr %c, i64 %n) {
entry:
  br label %l
l:
  %i = phi i64 [ 0, %entry ], [ %i1, %l ]
  call void @block(ptr %ab, ptr %c)
  %i1 = add i64 %i, 1
  %more = icmp slt i64 %i1, %n
  br i1 %more, label %l, label %done
done:
  ret void
}"""
    run = _function(ir, "loop", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    # Small values (bf16 bits of tiny numbers, bytes of 1 to 7), so no sum overflows or grows subnormal.
    operands = (np.full(4096, 0x3C00, np.uint16).view(np.uint8) if op == "tdpbf16ps"
                else np.random.default_rng(0).integers(1, 8, 8192).astype(np.uint8))
    accumulators = np.zeros(1024, dtype=np.int32)
    return calls * steps * 4 * _TILE_MACS[op] / _quickest(run, operands, accumulators, calls) / 1e9


def throughput(kind: str, chains: int = 16, steps: int = 1_000_000) -> float:
    """Multiply-adds per ns on one core: `chains` accumulators, each step's operands loaded from a 4 KiB
    buffer (in L1), so nothing is hoisted out of the loop."""
    if kind == "vdpbf16ps":
        op = ("  %xa{c} = load <32 x bfloat>, ptr %xp, align 4\n  %n{c} = call <16 x float> "
              "@llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %a{c}, <32 x bfloat> %xa{c}, <32 x bfloat> %wb)")
        weights, per = "  %wb = load <32 x bfloat>, ptr %wp, align 4", 32
    elif kind == "fma":
        op = ("  %xa{c} = load <16 x float>, ptr %xp, align 4\n  %n{c} = call <16 x float> "
              "@llvm.fma.v16f32(<16 x float> %xa{c}, <16 x float> %wf, <16 x float> %a{c})")
        weights, per = "  %wf = load <16 x float>, ptr %wp, align 4", 16
    else:
        op = ("  %xa{c} = load <16 x float>, ptr %xp, align 4\n  %m{c} = fmul <16 x float> %xa{c}, %wf\n"
              "  %n{c} = fadd <16 x float> %a{c}, %m{c}")
        weights, per = "  %wf = load <16 x float>, ptr %wp, align 4", 16
    phis = "\n".join(f"  %a{c} = phi <16 x float> [ zeroinitializer, %entry ], [ %n{c}, %loop ]" for c in range(chains))
    body = "\n".join(op.format(c=c) for c in range(chains))
    stores = "\n".join(f"  %s{c} = getelementptr <16 x float>, ptr %out, i64 {c}\n"
                       f"  store <16 x float> %n{c}, ptr %s{c}, align 4" for c in range(chains))
    ir = _DP + _FMA + f"""define void @loop(ptr %in, ptr %out, i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %loop ]
{phis}
  %slot = and i64 %i, 31
  %off = mul i64 %slot, 64
  %xp = getelementptr i8, ptr %in, i64 %off
  %woff = xor i64 %off, 1024
  %wp = getelementptr i8, ptr %in, i64 %woff
{weights}
{body}
  %i1 = add i64 %i, 1
  %more = icmp slt i64 %i1, %n
  br i1 %more, label %loop, label %done
done:
{stores}
  ret void
}}"""
    run = _function(ir, "loop", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    data = np.full(1024, 1e-3, dtype=np.float32)
    out = np.zeros(16 * chains, dtype=np.float32)
    return steps * chains * per / _quickest(run, data, out, steps) / 1e9


def _quickest(run: Any, operands: np.ndarray, out: np.ndarray, count: int) -> float:
    """Seconds of the quickest of three calls `run(operands, out, count)`, after a short warm-up call."""
    run(operands.ctypes.data, out.ctypes.data, max(1, count // 1000))
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        run(operands.ctypes.data, out.ctypes.data, count)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=20000, help="vdpbf16ps lanes compared")
    ap.add_argument("--tiles", type=int, default=20, help="tdpbf16ps tiles (256 outputs each) compared")
    args = ap.parse_args()
    features = llvm_kernels.cpu_features()
    rng = np.random.default_rng(0)
    rows: list[tuple[str, str, int, int]] = []
    if "avx512bf16" in features:
        rows += vdpbf16ps_rows(args.lanes, rng)
    else:
        rows.append(("vdpbf16ps", "not on this CPU (no AVX512-BF16)", 0, 0))
    tiles = {"amx-bf16", "amx-int8", "amx-tile"} <= features
    if tiles:
        rows += tdpbf16ps_rows(args.tiles, rng) + integer_tile_rows(args.tiles, rng)
    else:
        rows.append(("tdpbf16ps, tdpb*d", "not on this CPU (no AMX-BF16 and AMX-INT8)", 0, 0))
    print("| instruction | reading of what it computes | outputs equal | of |\n|---|---|---:|---:|")
    for instruction, reading, equal, total in rows:
        print(f"| {instruction} | {reading} | {equal if total else ''} | {total or ''} |")
    print("\n| loop (one core, 16 accumulators, operands from L1) | multiply-adds per ns |\n|---|---:|")
    kinds = (["vdpbf16ps"] if "avx512bf16" in features else []) + (
        ["fma", "multiply then add (the defined arithmetic)"] if "avx512f" in features else [])
    for kind in kinds:
        print(f"| {kind} | {throughput(kind):.1f} |")
    if "avx512f" not in features:
        print("| (the loops are written for AVX-512's 16-lane registers: not run on this CPU) | |")
    if tiles and _tile_state():
        print("\n| tile loop (one core, four accumulator tiles, operands from L1) | multiply-adds per ns |\n|---|---:|")
        for op in TILE_OPS:
            print(f"| {op} | {tile_throughput(op):.1f} |")


if __name__ == "__main__":
    main()

"""What the product kernels' choices buy, on the shapes they were made for:

    python benchmarks/product_kernels.py

Random operands (bf16 values that are normal numbers: subnormal operands take microcode assists on x86 and
would measure those), this machine's threads, best of 7 after a warm-up. Three tables:

1. A prefill's many-row product over bf16 weights (numerics/matrix_product.py) above K = SEGMENTED_ABOVE:
   the segmented kernel (1024 k at a time, the lane sums kept between segments) against the whole-K one
   (a block of x reread from L2 by every weight row); at K 2048 the whole-K kernel, which the product keeps.
2. A prefill's product over a 4-bit weight (numerics/weight_product.py): its blocks dequantized as bf16 bit
   patterns (1 MiB a thread) and multiplied as the product now does, against float32 blocks of 4 MiB with
   the whole-K kernel (what it did before, rebuilt here from the same kernels).
3. A decode step's one-row products (numerics/levels_product.py) streamed from memory, as a model's step
   reads them: a 1.5B's 84 MLP projections from their levels in each form with and without the prefetch
   (each setting in a process of its own: the kernels are compiled with it), and its 112 attention
   projections from their levels against from a bf16 copy.

Every row computes the bits the executors compute (tests/test_matrix_product.py, test_compiled_dequant.py,
test_levels_product.py); nothing here changes a build.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llmbuild  # noqa: E402, F401  (pins numpy's BLAS kernels, as the runtime does)
from llmbuild.numerics import (  # noqa: E402
    compiled_dequant,
    levels_product,
    matrix_product,
    vector_product,
    weight_product,
)
from llmbuild.numerics.dequantize import DequantizedRows  # noqa: E402
from llmbuild.numerics.parallel import row_spans  # noqa: E402

GROUP = 128
ATTRS = {"packed": True, "q_group_size": GROUP, "dequant_dtype": "bf16"}
PREFETCH_VARIABLE = "LLMBUILD_BENCH_PREFETCH"  # set in a child: the prefetch distance its kernels compile with


def best_ms(run: Callable[[], object], repeats: int = 7) -> float:
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def bf16_weight(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """bf16 bit patterns of normal numbers of either sign, magnitudes 2^-7 to 2."""
    return rng.integers(0x3C00, 0x3F80, (n, k), dtype=np.uint16) | (rng.integers(0, 2, (n, k), dtype=np.uint16) << 15)


def levels(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (rng.integers(0, 256, (n, k // 2), dtype=np.uint8),
            (rng.random((n, k // GROUP), dtype=np.float32) * 0.01 + 0.001).astype(np.float32),
            rng.integers(0, 16, (n, k // GROUP)).astype(np.float32))


def segmented_table(rng: np.random.Generator) -> None:
    print("| bf16 product (M x N x K) | segmented ms | whole-K ms |\n|---|---:|---:|")
    above = matrix_product.SEGMENTED_ABOVE
    for m, n, k in [(19, 1536, 8960), (128, 1536, 8960), (19, 3584, 18944), (64, 1024, 4096), (19, 2048, 2048)]:
        x = rng.standard_normal((m, k), dtype=np.float32)
        w, out = bf16_weight(rng, n, k), np.empty((m, n), np.float32)
        run = partial(matrix_product.product, x, w, out)
        segmented = best_ms(run) if k > above else float("nan")
        matrix_product.SEGMENTED_ABOVE = 1 << 40
        whole = best_ms(run)
        matrix_product.SEGMENTED_ABOVE = above
        print(f"| {m} x {n} x {k} | {segmented:.2f} | {whole:.2f} |")


def float32_blocks(x: np.ndarray, parts: tuple[np.ndarray, np.ndarray, np.ndarray], out: np.ndarray) -> None:
    """The product as it was: 4 MiB float32 blocks on each thread's rows, the whole-K kernel."""
    packed, scale, zero = parts
    n, k = packed.shape[0], packed.shape[1] * 2
    step = max(1, (1 << 20) // k)

    def span(lo: int, hi: int) -> None:
        buffer = np.empty((step, k), np.float32)
        for a in range(lo, hi, step):
            b = min(hi, a + step)
            compiled_dequant.dequantize_into(packed[a:b], scale[a:b], zero[a:b], GROUP, buffer[: b - a])
            matrix_product.product(x, buffer[: b - a], out[:, a:b])

    above, matrix_product.SEGMENTED_ABOVE = matrix_product.SEGMENTED_ABOVE, 1 << 40
    try:
        row_spans(n, n * k, 0, span)
    finally:
        matrix_product.SEGMENTED_ABOVE = above


def quantized_table(rng: np.random.Generator) -> None:
    print("\n| 4-bit product (M x N x K) | bf16 blocks, as now, ms | float32 blocks, as before, ms | same bits |")
    print("|---|---:|---:|---|")
    for m, n, k in [(19, 8960, 1536), (19, 1536, 8960), (128, 8960, 1536), (128, 1536, 8960)]:
        parts = levels(rng, n, k)
        weight = DequantizedRows(ATTRS, *parts, np.dtype(np.float32))
        x = rng.standard_normal((m, k), dtype=np.float32)
        now, before = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
        new_ms = best_ms(partial(weight_product.product_into, x, weight, now))
        old_ms = best_ms(partial(float32_blocks, x, parts, before))
        print(f"| {m} x {n} x {k} | {new_ms:.2f} | {old_ms:.2f} | {np.array_equal(now, before)} |")


def decode_rows(rng: np.random.Generator) -> None:
    """In a child: one line per form, the 1.5B's MLP levels streamed (84 products), then (with the prefetch
    on) its attention projections from levels and from bf16."""
    mlp = [levels(rng, *((8960, 1536) if i % 3 < 2 else (1536, 8960))) for i in range(84)]
    for bits in (4, 8):
        weights = mlp if bits == 4 else [(rng.integers(0, 256, (p[0].shape[0], p[0].shape[1] * 2), dtype=np.uint8),
                                          p[1], p[2]) for p in mlp[:42]]
        attrs = {**ATTRS, "packed": bits == 4}
        xs = [(rng.standard_normal(w[0].shape[1] * (2 if bits == 4 else 1), dtype=np.float32),
               np.empty(w[0].shape[0], np.float32)) for w in weights]
        for method in levels_product.METHODS if bits == 4 else ("arithmetic",):
            if levels_product.kernel(bits, True, method) is None:
                continue

            def step(weights=weights, xs=xs, attrs=attrs, method=method) -> None:
                for (packed, scale, zero), (x, out) in zip(weights, xs, strict=True):
                    levels_product.product(x, attrs, packed, scale, zero, out, method)

            gigabytes = sum(w[0].nbytes for w in weights) / 1e9
            print(f"mlp w{bits} {method} {len(weights)} {gigabytes:.3f} {best_ms(step, 3):.1f}")
    shapes = [(1536, 1536), (256, 1536), (256, 1536), (1536, 1536)] * 28
    attention = [levels(rng, n, k) for n, k in shapes]
    copies = [bf16_weight(rng, n, k) for n, k in shapes]
    xs = [(rng.standard_normal(k, dtype=np.float32), np.empty(n, np.float32)) for n, k in shapes]

    def from_levels() -> None:
        for (packed, scale, zero), (x, out) in zip(attention, xs, strict=True):
            levels_product.product(x, ATTRS, packed, scale, zero, out)

    def from_copies() -> None:
        for w, (x, out) in zip(copies, xs, strict=True):
            vector_product.product(x, w, out)

    print(f"attention {best_ms(from_levels, 3):.1f} {best_ms(from_copies, 3):.1f}")


def decode_table() -> None:
    rows: dict[int, list[str]] = {}
    for ahead in (0, levels_product.PREFETCH_BYTES):
        env = {**os.environ, PREFETCH_VARIABLE: str(ahead)}
        result = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, check=True)
        rows[ahead] = result.stdout.splitlines()
    print(f"\n| decode step, one row a product | prefetch {levels_product.PREFETCH_BYTES} B ahead, ms | "
          "none, ms | levels GB/s with it |\n|---|---:|---:|---:|")
    for on, off in zip(rows[levels_product.PREFETCH_BYTES], rows[0], strict=True):
        if on.startswith("mlp"):
            _, bits, method, count, gigabytes, ms = on.split()
            print(f"| a 1.5B's {count} MLP products, {bits} levels, {method} | {ms} | {off.split()[-1]} | "
                  f"{float(gigabytes) / float(ms) * 1e3:.1f} |")
    levels_ms, copies_ms = rows[levels_product.PREFETCH_BYTES][-1].split()[1:]
    print(f"\n| a 1.5B's 112 attention projections, one decode step | ms |\n|---|---:|\n"
          f"| from the 4-bit levels (prefetched) | {levels_ms} |\n| from a bf16 copy | {copies_ms} |")


def main() -> None:
    rng = np.random.default_rng(0)
    if PREFETCH_VARIABLE in os.environ:
        levels_product.PREFETCH_BYTES = int(os.environ[PREFETCH_VARIABLE])  # before the kernels compile
        decode_rows(rng)
        return
    segmented_table(rng)
    quantized_table(rng)
    decode_table()


if __name__ == "__main__":
    main()

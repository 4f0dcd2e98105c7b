"""Attention in the products' defined arithmetic against numpy's BLAS, on the shapes where it matters:

    python benchmarks/attention_paths.py

The executors' FAttention kernel (numerics/kernels.py) on random float32 operands with a causal mask, best of
3 after a warm-up, two ways: as it runs (float32 takes numerics/attention_rows.py, whose rows have bits of
their own, so a prefill computes its real rows only) and with that path switched off (BLAS over every row of
the block, as before it). Rows: SmolLM2's prefill net (128 rows, 9 query and 3 KV heads of 64) with a
37-token prompt and full; a 1.5B-shaped net (512 rows, 12 and 2 heads of 128) full, without and with key
blocks of 256; a vision tower's unmasked attention (1025 patches, 16 heads of 64 each with its own keys);
decode steps (one query row, a history of keys, the empty cache, the new row last) of SmolLM2's 512-key net
and a 1.5B's 2048-key net (BLAS runs every key; the defined arithmetic the keys shown; a longer net's
decode step has key blocks, whose hidden blocks the host path skips either way).
A short prompt in a larger net is where the defined arithmetic gains (it computes the prompt's rows, BLAS
every row); a full net is where it pays (a lane tree per score, over only d products). Nothing here changes
a build.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llmbuild  # noqa: E402, F401  (pins numpy's BLAS kernels, as the runtime does)
from llmbuild.numerics import attention_rows  # noqa: E402
from llmbuild.numerics.kernels import KERNELS  # noqa: E402


def operands(rows: int, keys: int, heads: int, kv_heads: int, d: int, real: int | None, causal: bool | int,
             **tiles: int) -> tuple[dict[str, Any], list[np.ndarray]]:
    """`causal`: True for a causal mask, False for none, a number for a decode step on that many keys."""
    rng = np.random.default_rng(rows + heads)
    q = rng.standard_normal((1, rows, heads, d)).astype(np.float32)
    k, v = (rng.standard_normal((1, keys, kv_heads, d)).astype(np.float32) for _ in range(2))
    mask = np.zeros((1, 1, rows, keys), dtype=np.float32)
    if not isinstance(causal, bool):  # a decode step: its history, the empty cache, the new row last
        mask[:] = -9984.0
        mask[0, 0, 0, :causal] = mask[0, 0, 0, -1] = 0
    elif causal:
        mask[:] = -9984.0
        for r in range(rows):
            mask[0, 0, r, : keys - rows + r + 1] = 0
    attrs: dict[str, Any] = {"scale": d**-0.5, "kv_head": kv_heads, "q_head": heads, **tiles}
    if real is not None:
        attrs["active_rows"] = real
    return attrs, [q, k, v, mask]


def best_ms(attrs: dict[str, Any], args: list[np.ndarray], repeats: int = 3) -> float:
    KERNELS["FAttention"](attrs, *args)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        KERNELS["FAttention"](attrs, *args)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


CASES = {
    "SmolLM2 prefill net, 37-token prompt": (128, 128, 9, 3, 64, 37, True, {}),
    "SmolLM2 prefill net, full": (128, 128, 9, 3, 64, None, True, {}),
    "1.5B-shaped net, 512 rows, full": (512, 512, 12, 2, 128, None, True, {}),
    "1.5B-shaped net, 512 rows, full, key blocks of 256": (512, 512, 12, 2, 128, None, True, {"tile_k": 256}),
    "vision tower, 1025 patches, unmasked": (1025, 1025, 16, 16, 64, None, False, {}),
    "SmolLM2 decode step, 40 of 512 keys": (1, 513, 9, 3, 64, None, 40, {}),
    "SmolLM2 decode step, 500 of 512 keys": (1, 513, 9, 3, 64, None, 500, {}),
    "1.5B decode step, 40 of 2048 keys": (1, 2049, 12, 2, 128, None, 40, {}),
    "1.5B decode step, 1000 of 2048 keys": (1, 2049, 12, 2, 128, None, 1000, {}),
    "1.5B decode step, 2040 of 2048 keys": (1, 2049, 12, 2, 128, None, 2040, {}),
}


def main() -> None:
    supported = attention_rows.supported
    print("| case | defined arithmetic ms | BLAS ms |\n|---|---:|---:|")
    for name, (rows, keys, heads, kv_heads, d, real, causal, tiles) in CASES.items():
        attrs, args = operands(rows, keys, heads, kv_heads, d, real, causal, **tiles)
        attention_rows.supported = supported
        exact = best_ms(attrs, args)
        attention_rows.supported = lambda *a: False  # type: ignore[assignment]
        blas = best_ms(attrs, args)
        attention_rows.supported = supported
        print(f"| {name} | {exact:.2f} | {blas:.2f} |")


if __name__ == "__main__":
    main()

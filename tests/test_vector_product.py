"""The one-row product (numerics/vector_product.py): the compiled kernel has the bits of numpy's reference
for every weight type, every K, non-finite values and rows split over threads; the reference is the
arithmetic its docstring defines; and it stays within float32's error of a float64 product."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import stored_weight

from llmbuild.numerics import vector_product

needs_kernel = pytest.mark.skipif(vector_product.kernel("f32") is None, reason="no compiled kernel (llvmlite)")


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@needs_kernel
@pytest.mark.parametrize("storage", ["f32", "bf16", "f16"])
@pytest.mark.parametrize(("n", "k"), [(1, 64), (7, 128), (576, 576), (192, 1536), (33, 8960)])
def test_the_kernel_has_the_bits_of_the_reference(storage: str, n: int, k: int) -> None:
    rng = np.random.default_rng(n * k)
    stored, values = stored_weight(rng, n, k, storage)
    x = rng.standard_normal(k).astype(np.float32)
    out = np.empty(n, dtype=np.float32)
    vector_product.product(x, stored, out)
    assert np.array_equal(_bits(out), _bits(vector_product.reference(x, values)))
    decoded = np.empty(n, dtype=np.float32)  # the device's float32 copy of the same weight
    vector_product.product(x, values, decoded)
    assert np.array_equal(_bits(decoded), _bits(out))


@pytest.mark.parametrize("k", [1, 63, 100, 4304])
def test_k_not_a_multiple_of_the_lanes_is_padded_with_zeros(k: int) -> None:
    """Such a K takes the reference (the kernel's blocks are whole): the same sums as the next multiple of 64
    with zero weights."""
    rng = np.random.default_rng(k)
    w = rng.standard_normal((5, k)).astype(np.float32)
    x = rng.standard_normal(k).astype(np.float32)
    pad = -(-k // 64) * 64
    wide_w, wide_x = np.zeros((5, pad), np.float32), np.zeros(pad, np.float32)
    wide_w[:, :k], wide_x[:k] = w, x
    out = np.empty(5, dtype=np.float32)
    vector_product.product(x, w, out)
    assert np.array_equal(_bits(out), _bits(vector_product.reference(wide_x, wide_w)))


def test_the_reference_is_the_defined_order() -> None:
    """Lane j sums k = j (mod 64) in order, in float32; then (l[j] + l[j+16]) + (l[j+32] + l[j+48]) and
    halves of 8, 4, 2, 1: written out with Python floats rounded to float32 at every step."""
    rng = np.random.default_rng(9)
    k = 192
    w = rng.standard_normal((3, k)).astype(np.float32)
    x = rng.standard_normal(k).astype(np.float32)
    f = np.float32
    for row in range(3):
        lanes = [f(0)] * 64
        for i in range(k):
            lanes[i % 64] = f(lanes[i % 64] + f(x[i] * w[row, i]))
        v = [f(f(lanes[j] + lanes[j + 16]) + f(lanes[j + 32] + lanes[j + 48])) for j in range(16)]
        while len(v) > 1:
            half = len(v) // 2
            v = [f(v[j] + v[j + half]) for j in range(half)]
        assert _bits(vector_product.reference(x, w[row : row + 1]))[0] == _bits(np.array([v[0]]))[0]


@needs_kernel
def test_non_finite_values_propagate_as_in_the_reference() -> None:
    rng = np.random.default_rng(4)
    w = rng.standard_normal((8, 128)).astype(np.float32)
    w[1, 5], w[2, 70], w[3, 0], w[3, 64] = np.nan, np.inf, np.inf, -np.inf
    x = rng.standard_normal(128).astype(np.float32)
    x[100] = np.float32(3e38)  # products overflow to inf
    out = np.empty(8, dtype=np.float32)
    vector_product.product(x, w, out)
    want = vector_product.reference(x, w)
    assert np.isnan(out[1]) and np.isnan(out[3])  # inf - inf
    assert np.array_equal(np.isnan(out), np.isnan(want))
    assert np.array_equal(_bits(out)[~np.isnan(out)], _bits(want)[~np.isnan(want)])


@needs_kernel
@pytest.mark.parametrize("workers", ["1", "2", "3"])
def test_rows_split_over_threads_change_no_bit(workers: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", workers)  # numerics.parallel.workers() reads it
    rng = np.random.default_rng(5)
    n, k = vector_product.PARALLEL_WEIGHTS // 512 + 3, 512  # above the threshold, rows not in equal parts
    raw, values = stored_weight(rng, n, k, "bf16")
    x = rng.standard_normal(k).astype(np.float32)
    out = np.empty(n, dtype=np.float32)
    vector_product.product(x, raw, out)
    assert np.array_equal(_bits(out), _bits(vector_product.reference(x, values)))


def test_within_float32_error_of_a_float64_product() -> None:
    rng = np.random.default_rng(6)
    w = rng.standard_normal((64, 4096)).astype(np.float32)
    x = rng.standard_normal(4096).astype(np.float32)
    out = np.empty(64, dtype=np.float32)
    vector_product.product(x, w, out)
    exact = w.astype(np.float64) @ x.astype(np.float64)
    bound = 4096 * np.finfo(np.float32).eps * (np.abs(w).astype(np.float64) @ np.abs(x).astype(np.float64))
    assert np.isfinite(out).all() and (np.abs(out - exact) <= bound).all()
    assert np.abs(out - exact).max() > 0  # float32 arithmetic, not a float64 product rounded once

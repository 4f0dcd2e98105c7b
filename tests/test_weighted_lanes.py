"""A decode step's value product from the values where they lie (numerics/weighted_lanes.py): the compiled
lanes and tree against the products' numpy reference (matrix_product.reference over [vᵀ; 1]), and against
the kernel's own numpy fallback."""

from __future__ import annotations

import numpy as np
import pytest

from llmbuild.numerics import matrix_product, weighted_lanes
from llmbuild.numerics.vector_product import tree_sum

pytestmark = pytest.mark.skipif(weighted_lanes._KERNELS.get((1, 4)) is None, reason="llvmlite cannot build it")


def _reference(p: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p·v, Σp) of p [heads, rows, n] and v [n, heads, d] by the products' arithmetic on [vᵀ; 1]."""
    heads, rows, n = p.shape
    d = v.shape[2]
    values, totals = np.empty((heads, rows, d), np.float32), np.empty((heads, rows), np.float32)
    for h in range(heads):
        w = np.concatenate([v[:, h].T, np.ones((1, n), np.float32)])
        out = matrix_product.reference(p[h], w)
        values[h], totals[h] = out[:, :d], out[:, d]
    return values, totals


def _in_runs(p: np.ndarray, v: np.ndarray, cuts: list[int], numpy_only: bool) -> tuple[np.ndarray, np.ndarray]:
    heads, rows, n = p.shape
    d = v.shape[2]
    lanes = weighted_lanes.lanes_for(heads, rows, d)
    saved = weighted_lanes._KERNELS
    if numpy_only:
        weighted_lanes._KERNELS = type("NoKernels", (), {"get": staticmethod(lambda key: None)})()
    try:
        for start, stop in zip([0, *cuts], [*cuts, n], strict=True):
            weighted_lanes.accumulate(p[..., start:stop], v[start:stop], start, lanes)
        summed = weighted_lanes.summed(lanes)
        assert np.array_equal(summed, tree_sum(np.moveaxis(lanes, 2, 3)), equal_nan=True)  # the compiled tree
        return summed[..., :d], summed[..., d]
    finally:
        weighted_lanes._KERNELS = saved


@pytest.mark.parametrize("heads, rows, n, d, cuts", [
    (3, 3, 513, 64, [64]),          # SmolLM2's group: the history's blocks, then the new row's
    (2, 6, 2049, 128, [1984]),      # a 1.5B's: kernels of 6 rows, 4 vectors a pass
    (1, 7, 300, 128, [128, 192]),   # a 7B's 7 rows: 4 vectors a pass would take 28 registers, so 2
    (2, 11, 70, 96, []),            # more rows than one kernel holds (8 and 3), d of 6 vectors
    (1, 2, 5, 32, []),              # fewer keys than lanes
])
def test_the_lanes_have_the_products_bits(heads, rows, n, d, cuts):
    rng = np.random.default_rng(n + d)
    p = rng.random((heads, rows, n), dtype=np.float32) * rng.choice([1.0, 1e-30, 1e20], size=(heads, rows, n))
    p = p.astype(np.float32)
    v = rng.standard_normal((n, heads, d), dtype=np.float32)
    values, totals = _in_runs(p, v, cuts, numpy_only=False)
    expected_values, expected_totals = _reference(p, v)
    assert np.array_equal(values, expected_values) and np.array_equal(totals, expected_totals)
    fallback_values, fallback_totals = _in_runs(p, v, cuts, numpy_only=True)
    assert np.array_equal(fallback_values, values) and np.array_equal(fallback_totals, totals)


def test_a_nan_or_an_infinity_reaches_only_its_own_outputs():
    rng = np.random.default_rng(4)
    p = rng.random((2, 6, 200), dtype=np.float32)
    v = rng.standard_normal((200, 2, 128), dtype=np.float32)
    v[70, 0, 3], v[71, 1, 9] = np.nan, np.inf
    values, _ = _in_runs(p, v, [64], numpy_only=False)
    assert np.isnan(values[0, :, 3]).all() and np.isinf(values[1, :, 9]).all()
    assert np.isfinite(np.delete(values[0], 3, axis=1)).all() and np.isfinite(np.delete(values[1], 9, axis=1)).all()
    expected, _ = _reference(p, v)
    assert np.array_equal(values, expected, equal_nan=True)

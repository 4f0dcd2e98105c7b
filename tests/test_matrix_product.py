"""The many-row product (numerics/matrix_product.py): the compiled kernel has the bits of numpy's reference
for every weight type and shape; a prefill row has the bits of the same row in a decode step; tiles,
threads and how the weight is held change no bit; and it stays within float32's error of float64."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import stored_weight

from llmbuild.numerics import matrix_product, vector_product
from llmbuild.numerics.dequantize import DequantizedRows
from llmbuild.numerics.formats import bf16_bits_to_f32, encode, f32_to_bf16_bits
from llmbuild.numerics.stored import StoredTensor
from llmbuild.numerics.weight_product import tiled_product

needs_kernel = pytest.mark.skipif(matrix_product.kernel("f32") is None, reason="no compiled kernel (llvmlite)")


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@needs_kernel
@pytest.mark.parametrize("storage", ["f32", "bf16", "f16"])
@pytest.mark.parametrize(("m", "n", "k"), [(2, 1, 64), (3, 7, 128), (4, 9, 192), (5, 33, 576), (6, 5, 64),
                                           (7, 11, 128), (9, 64, 1536), (19, 13, 256), (40, 17, 640),
                                           (7, 11, 2112), (6, 40, 3136), (19, 35, 4096)])
def test_the_kernel_has_the_bits_of_the_reference(storage: str, m: int, n: int, k: int) -> None:
    """Every row count's blocks: of four, then one of three, two or one (6, 7 and 19 rows take each); K above
    SEGMENTED_ABOVE takes the segmented kernel (a last segment shorter than the others, weight rows past one
    chunk)."""
    rng = np.random.default_rng(m * n * k)
    stored, values = stored_weight(rng, n, k, storage)
    x = rng.standard_normal((m, k)).astype(np.float32)
    wide = np.full((m, n + 5), np.nan, dtype=np.float32)  # the result written into a column slice
    matrix_product.product(x, stored, wide[:, 2 : 2 + n])
    assert np.array_equal(_bits(wide[:, 2 : 2 + n]), _bits(matrix_product.reference(x, values)))
    assert np.isnan(wide[:, :2]).all() and np.isnan(wide[:, 2 + n :]).all()


def test_the_reference_is_the_one_row_arithmetic_row_by_row() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 320)).astype(np.float32)
    w = rng.standard_normal((11, 320)).astype(np.float32)
    want = np.stack([vector_product.reference(row, w) for row in x])
    assert np.array_equal(_bits(matrix_product.reference(x, w)), _bits(want))


@needs_kernel
@pytest.mark.parametrize("storage", ["f32", "bf16"])
def test_a_prefill_row_has_the_bits_of_a_decode_step(storage: str) -> None:
    rng = np.random.default_rng(2)
    stored, _ = stored_weight(rng, 96, 576, storage)
    x = rng.standard_normal((13, 576)).astype(np.float32)
    many = np.empty((13, 96), dtype=np.float32)
    matrix_product.product(x, stored, many)
    for row in range(13):
        one = np.empty(96, dtype=np.float32)
        vector_product.product(x[row], stored, one)
        assert np.array_equal(_bits(many[row]), _bits(one))


@needs_kernel
@pytest.mark.parametrize("storage", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("k", [32, 100, 4304])
def test_k_not_a_multiple_of_the_lanes_runs_compiled_on_zero_padded_operands(
        storage: str, k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """K padded with zeros to whole blocks of lanes is what the arithmetic defines (the reference pads x and
    w the same way): the compiled kernel on padded operands has the reference's bits, and no row takes the
    numpy reference (a SigLIP MLP's K is 4304)."""
    rng = np.random.default_rng(k)
    x = rng.standard_normal((5, k)).astype(np.float32)
    values = rng.standard_normal((9, k)).astype(np.float32)
    stored = {"f32": values, "bf16": f32_to_bf16_bits(values), "f16": values.astype(np.float16)}[storage]
    want = matrix_product.reference(x, bf16_bits_to_f32(stored) if storage == "bf16" else
                                    np.asarray(stored, dtype=np.float32))
    monkeypatch.setattr(matrix_product, "reference", lambda *a: pytest.fail("took the numpy reference"))
    out = np.empty((5, 9), dtype=np.float32)
    matrix_product.product(x, stored, out)
    assert np.array_equal(_bits(out), _bits(want))


@needs_kernel
def test_non_finite_values_propagate() -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 128)).astype(np.float32)
    w = rng.standard_normal((6, 128)).astype(np.float32)
    x[1, 3], w[2, 70], w[4, 9] = np.inf, np.nan, -np.inf
    out = np.empty((5, 6), dtype=np.float32)
    matrix_product.product(x, w, out)
    with np.errstate(all="ignore"):
        want = matrix_product.reference(x, w)
    assert np.array_equal(_bits(out), _bits(want))
    assert np.isnan(out[:, 2]).all() and not np.isfinite(out[1]).any()


@needs_kernel
def test_the_segmented_kernel_keeps_the_lane_sums_across_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """K of three segments and a part: the segmented kernel (the one taken: the whole-K kernel is made to
    fail) has the bits of the reference, an infinity in the first segment and a NaN in the last carried to
    the end."""
    k = 3 * matrix_product.SEGMENT + 64
    assert k > matrix_product.SEGMENTED_ABOVE
    rng = np.random.default_rng(6)
    x = rng.standard_normal((6, k)).astype(np.float32)
    w = rng.standard_normal((37, k)).astype(np.float32)
    x[1, 3], w[2, k - 10], w[4, matrix_product.SEGMENT + 9] = np.inf, np.nan, -np.inf
    whole = matrix_product._KERNELS.get("f32")
    table = matrix_product._KERNELS._table
    monkeypatch.setitem(table, "f32", lambda *a: pytest.fail("took the whole-K kernel"))
    monkeypatch.setitem(table, ("span", "f32"), None)
    out = np.empty((6, 37), dtype=np.float32)
    matrix_product.product(x, w, out)
    with np.errstate(all="ignore"):
        want = matrix_product.reference(x, w)
    assert whole is not None and np.array_equal(_bits(out), _bits(want))
    assert np.isnan(out[:, 2]).all() and not np.isfinite(out[1]).any() and np.isfinite(out[0, 5])


@pytest.mark.parametrize("threads", ["1", "2", "3"])
@pytest.mark.parametrize("attrs", [{}, {"tile_m": 16}, {"tile_n": 96}, {"tile_m": 48, "active_rows": 70}])
def test_tiles_threads_and_holders_change_no_bit(threads: str, attrs: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """tiled_product over a bf16 weight as stored, decoded to float32, and as 4-bit levels dequantized to the
    same values: the same bits on 1 to 3 threads as the reference on the real rows, zero after them."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", threads)
    rng = np.random.default_rng(5)
    n, k, group = 320, 576, 64
    packed = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    scale = (rng.random((n, k // group)) * 0.02 + 0.001).astype(np.float32)
    zero = rng.integers(0, 16, size=(n, k // group), dtype=np.uint8)
    q_attrs = {"packed": True, "q_group_size": group, "dequant_dtype": "bf16"}
    levels = DequantizedRows(q_attrs, packed, scale, zero, np.dtype(np.float32))
    values = levels.rows(0, n)
    x = rng.standard_normal((1, 100, k)).astype(np.float32)
    rows = attrs.get("active_rows", 100)
    want = np.zeros((100, n), dtype=np.float32)
    want[:rows] = matrix_product.reference(x[0, :rows], values)
    for weight in (StoredTensor(encode(values, "bf16"), "bf16"), values, levels):
        got = tiled_product(attrs, x, weight)
        assert np.array_equal(_bits(got[0]), _bits(want))


def test_within_float32_error_of_float64() -> None:
    """|y - y64| <= (K + 1) eps (|x| |w|), the bound of any float32 order of K sums, far under it in practice."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((7, 1536)).astype(np.float32)
    w = rng.standard_normal((50, 1536)).astype(np.float32)
    out = np.empty((7, 50), dtype=np.float32)
    matrix_product.product(x, w, out)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    bound = 1537 * np.finfo(np.float32).eps * (np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64))
    assert (np.abs(out - exact) <= bound).all()
    assert np.abs(out - exact).max() < 0.01 * bound.max()

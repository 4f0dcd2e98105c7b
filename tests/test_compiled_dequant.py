"""The compiled dequantizer gives the bits of numpy's passes (dequantize._dequantize_block), levels two to a
byte or one; the host path leaves only large 4-bit weights quantized, and whole weights of any size use it."""

from __future__ import annotations

import numpy as np
import pytest

from llmbuild.numerics import compiled_dequant, dequantize, kernels, vector_product, weight_product
from llmbuild.numerics.formats import decode, encode
from llmbuild.numerics.stored import StoredTensor

ATTRS = {"packed": True, "dequant_dtype": "bf16"}


def _numpy_passes(packed: np.ndarray, scale: np.ndarray, zero: np.ndarray, group: int, two: bool = True,
                  rounded: bool = True) -> np.ndarray:
    out = np.empty((packed.shape[0], packed.shape[1] * (2 if two else 1)), dtype=np.float32)
    attrs = {**ATTRS, "q_group_size": group, "packed": two}
    dequantize._dequantize_block(attrs, packed, scale, zero, 0, packed.shape[0], out, rounded)
    return out


def _compiled(packed: np.ndarray, scale: np.ndarray, zero: np.ndarray, group: int, two: bool = True,
              rounded: bool = True) -> np.ndarray:
    out = np.full((packed.shape[0], packed.shape[1] * (2 if two else 1)), np.nan, dtype=np.float32)
    compiled_dequant.dequantize_into(packed, scale, zero, group, out, rounded)
    return out


@pytest.mark.parametrize("group", [16, 32, 64, 128])
@pytest.mark.parametrize("zero_dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("two", [True, False], ids=["two-a-byte", "one-a-byte"])
@pytest.mark.parametrize("rounded", [True, False], ids=["bf16", "f32"])
def test_the_compiled_kernel_gives_the_bits_of_the_numpy_passes(group: int, zero_dtype: type, two: bool,
                                                                 rounded: bool) -> None:
    """Levels two to a byte (the binary's 4-bit weights) and one (TopOp's levels, 8-bit weights), rounded to
    bf16 (the device's dequantizer) or not (TopOp's float reference)."""
    rng = np.random.default_rng(group)
    rows, k = 9, 4 * group
    packed = rng.integers(0, 256, size=(rows, k // 2 if two else k), dtype=np.uint8)
    # Scales of every magnitude (a bf16 checkpoint's, arbitrary float32 ones, subnormal, near overflow) so
    # that rounding to bf16 meets ties, carries into the exponent and overflow to infinity.
    scale = np.concatenate([
        decode(encode((rng.random((3, k // group)) * 0.02 + 1e-4).astype(np.float32), "bf16"), "bf16"),
        (rng.standard_normal((3, k // group)) * 10.0 ** rng.integers(-40, 38, (3, k // group))).astype(np.float32),
        np.full((3, k // group), 3.0e37, dtype=np.float32) * rng.random((3, k // group)).astype(np.float32),
    ])
    zero = rng.integers(0, 16, size=(rows, k // group)).astype(zero_dtype)
    packed[-1, 0], zero[-1, 0], scale[-1, 0] = 0xFF if two else 15, 0, 3.0e37  # 15 x 3e37: past float32's top
    with np.errstate(over="ignore"):
        want = _numpy_passes(packed, scale, zero, group, two, rounded)
    got = _compiled(packed, scale, zero, group, two, rounded)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
    assert np.isinf(got).any()  # the overflow rows did reach infinity: that path was compared too
    if rounded:  # stored as bf16 bit patterns (a prefill's blocks): the top halves of the same floats
        bits = np.full(got.shape, 0x1234, dtype=np.uint16)
        compiled_dequant.dequantize_into(packed, scale, zero, group, bits, rounded)
        assert np.array_equal(bits, (want.view(np.uint32) >> 16).astype(np.uint16))


def test_non_finite_scales_give_the_same_nan_and_infinities() -> None:
    rng = np.random.default_rng(7)
    packed = rng.integers(0, 256, size=(4, 64), dtype=np.uint8)
    scale = rng.random((4, 4)).astype(np.float32)
    scale[0, 0], scale[1, 1], scale[2, 2], scale[3, 3] = np.inf, np.nan, -np.inf, 0.0
    zero = np.full((4, 4), 8, dtype=np.uint8)  # level 8 times an infinite scale: 0 * inf, a NaN
    with np.errstate(invalid="ignore"):
        want = _numpy_passes(packed, scale, zero, 32)
    got = _compiled(packed, scale, zero, 32)
    assert np.isnan(got).any() and np.isinf(got).any()
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))  # NaN as the canonical bf16 NaN


def test_only_large_4bit_weights_use_it() -> None:
    big = compiled_dequant.MIN_WEIGHTS
    assert compiled_dequant.wanted(big, {**ATTRS, "q_group_size": 64}, np.dtype(np.float32))
    assert not compiled_dequant.wanted(big - 1, {**ATTRS, "q_group_size": 64}, np.dtype(np.float32))
    assert not compiled_dequant.wanted(big, {"packed": True, "q_group_size": 64}, np.dtype(np.float32))
    assert not compiled_dequant.wanted(big, {**ATTRS, "q_group_size": 64}, np.dtype(np.float16))


def test_once_loaded_it_dequantizes_small_whole_weights_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole weight below the threshold (the host's cache of attention projections) takes the kernel
    once a large weight loaded it, with numpy's bits; never a weight it cannot take."""
    attrs = {**ATTRS, "q_group_size": 64}
    assert compiled_dequant.kernel() is not None
    assert compiled_dequant.ready(attrs, np.dtype(np.float32))
    assert compiled_dequant.ready({"dequant_dtype": "bf16", "q_group_size": 64}, np.dtype(np.float32))  # a byte each
    assert compiled_dequant.ready({"q_group_size": 64}, np.dtype(np.float32))  # TopOp's, not rounded
    assert not compiled_dequant.ready({"dequant_dtype": "f16", "q_group_size": 64}, np.dtype(np.float32))
    assert not compiled_dequant.ready({**ATTRS, "q_group_size": 8}, np.dtype(np.float32))
    assert not compiled_dequant.ready(attrs, np.dtype(np.float16))
    rng = np.random.default_rng(5)
    packed = rng.integers(0, 256, (48, 96), dtype=np.uint8)
    scale = (rng.random((48, 3)) * 0.02).astype(np.float32)
    zero = rng.integers(0, 16, (48, 3)).astype(np.float32)
    calls = []
    monkeypatch.setattr(compiled_dequant, "dequantize_into",
                        lambda *a: calls.append(1) or _compiled_into(*a))
    bits = dequantize.dequantize_bf16_bits(attrs, packed, scale, zero)
    assert calls, "the loaded kernel was not used for a small weight"
    want = _numpy_passes(packed, scale, zero, 64)
    assert np.array_equal(bits, (want.view(np.uint32) >> 16).astype(np.uint16))


_compiled_into = compiled_dequant.dequantize_into


@pytest.mark.parametrize("held", ["as stored", "as the host holds it"])
@pytest.mark.parametrize(("workers", "chunk_rows", "rows"), [("1", 1024, 1), ("2", 1024, 1), ("3", 48, 1),
                                                            ("2", 1024, 5), ("3", 48, 3)])
def test_a_product_over_a_large_stored_weight_has_the_bits_of_the_numpy_path(
        workers: str, chunk_rows: int, rows: int, held: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A16MatMul on a weight at the threshold, read in its storage format against the same weight whole
    (numpy's passes): a 7B decode step's product (one row: the levels kernel; spans of rows on `workers`
    threads, read `chunk_rows` at a time, or, with the scales and zero points as float32 arrays as the host
    holds them, the whole weight in one call that splits itself) and a prefill's (several rows: the compiled
    dequantizer's blocks, each multiplied by every row)."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", workers)  # numerics.parallel.workers() reads it
    rng = np.random.default_rng(3)
    n, k, g = 1024, compiled_dequant.MIN_WEIGHTS // 1024, 128
    packed = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    scale_raw = encode((rng.random((n, k // g)) * 0.02 + 0.001).astype(np.float32), "bf16")
    zero = rng.integers(0, 16, size=(n, k // g), dtype=np.uint8)
    attrs = {**ATTRS, "q_group_size": g}
    monkeypatch.setattr(weight_product, "LEVEL_CHUNK_BYTES", chunk_rows * k // 2)
    x = rng.standard_normal((1, rows, k)).astype(np.float32)
    stored = dequantize.DequantizedRows(attrs, StoredTensor(packed, "u8"), StoredTensor(scale_raw, "bf16"),
                                        StoredTensor(zero, "u8"), np.dtype(np.float32))
    assert stored.compiled and stored.fused
    whole = np.empty((n, k), dtype=np.float32)
    for lo in range(0, n, 64):
        dequantize._dequantize_block(attrs, packed, decode(scale_raw, "bf16"), zero, lo, lo + 64,
                                     whole[lo:lo + 64], True)
    scale_held, zero_held = ((StoredTensor(scale_raw, "bf16"), StoredTensor(zero, "u8")) if held == "as stored"
                             else (decode(scale_raw, "bf16"), zero.astype(np.float32)))
    got = kernels.KERNELS["A16MatMul"](attrs, x, StoredTensor(packed, "u8"), scale_held, zero_held)
    want = np.stack([vector_product.reference(row, whole) for row in x[0]])
    assert np.array_equal(got[0], want)

"""The one-row product from 4- and 8-bit levels (numerics/levels_product.py) has the bits of dequantizing
by A16MatMul's specification first and multiplying in vector_product's arithmetic after: every level
width and rounding, groups of 64 to K, non-finite scales, any thread count, and through A16MatMul's kernel
on weights held in their storage format."""

from __future__ import annotations

import numpy as np
import pytest

from llmbuild.numerics import levels_product, vector_product
from llmbuild.numerics.formats import encode
from llmbuild.numerics.kernels import KERNELS
from llmbuild.numerics.stored import StoredTensor
from llmbuild.op_defs.a16_matmul import dequantize as specified_dequantize

needs_kernel = pytest.mark.skipif(levels_product.kernel(4, True, "arithmetic") is None,
                                  reason="no compiled kernel (llvmlite)")
# Every form of the product (4-bit levels: AVX-512F's vpermps table, AVX2's byte-shuffle table, arithmetic),
# each where this CPU runs it: each must have the same bits.
KINDS = [pytest.param(bits, rounded, method, marks=pytest.mark.skipif(
             levels_product.kernel(bits, rounded, method) is None, reason=f"this CPU has no {method} form"))
         for bits, rounded, method in levels_product.KINDS]
FORMS = [pytest.param(method, marks=pytest.mark.skipif(levels_product.kernel(4, True, method) is None,
                                                       reason=f"this CPU has no {method} form"))
         for method in levels_product.METHODS]


def _weight(rng: np.random.Generator, n: int, k: int, group: int, bits: int) -> tuple[np.ndarray, ...]:
    levels = rng.integers(0, 256, size=(n, k // 2 if bits == 4 else k), dtype=np.uint8)
    scale = (rng.random((n, k // group)) * 0.02 + 0.001).astype(np.float32)
    zero = rng.integers(0, 16 if bits == 4 else 256, size=(n, k // group), dtype=np.uint8)
    return levels, scale, zero


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@needs_kernel
@pytest.mark.parametrize(("bits", "rounded", "method"), KINDS)
@pytest.mark.parametrize(("n", "k", "group"), [(1, 64, 64), (9, 256, 128), (40, 1536, 64), (17, 640, 640)])
def test_the_kernel_has_the_bits_of_dequantize_then_multiply(bits: int, rounded: bool, n: int, k: int,
                                                             group: int, method: str) -> None:
    rng = np.random.default_rng(n * k + bits)
    levels, scale, zero = _weight(rng, n, k, group, bits)
    attrs = {"packed": bits == 4, "q_group_size": group, **({"dequant_dtype": "bf16"} if rounded else {})}
    x = rng.standard_normal(k).astype(np.float32)
    out = np.empty(n, dtype=np.float32)
    assert levels_product.supported(attrs, k)
    levels_product.product(x, attrs, levels, scale, zero.astype(np.float32), out, method=method)
    want = vector_product.reference(x, specified_dequantize(attrs, levels, scale, zero).astype(np.float32))
    assert np.array_equal(_bits(out), _bits(want))


@needs_kernel
@pytest.mark.parametrize("method", FORMS)
def test_non_finite_scales_and_the_nan_rounding(method: str) -> None:
    """A NaN scale gives the canonical NaN weight, an infinite one infinities: as the specification rounds."""
    rng = np.random.default_rng(3)
    levels, scale, zero = _weight(rng, 6, 256, 64, 4)
    scale[1, 2], scale[3, 0] = np.nan, np.inf
    attrs = {"packed": True, "q_group_size": 64, "dequant_dtype": "bf16"}
    x = rng.standard_normal(256).astype(np.float32)
    out = np.empty(6, dtype=np.float32)
    levels_product.product(x, attrs, levels, scale, zero.astype(np.float32), out, method=method)
    with np.errstate(all="ignore"):
        want = vector_product.reference(x, specified_dequantize(attrs, levels, scale, zero).astype(np.float32))
    assert np.array_equal(_bits(out), _bits(want))
    assert np.isnan(out[1]) and np.isnan(out[3])  # inf * (level - zero) meets a zero difference: NaN


def test_groups_that_split_a_block_are_not_taken() -> None:
    assert not levels_product.supported({"packed": True, "q_group_size": 32, "dequant_dtype": "bf16"}, 256)
    assert not levels_product.supported({"packed": True, "q_group_size": 64, "dequant_dtype": "f16"}, 256)
    assert not levels_product.supported({"packed": True, "q_group_size": 64}, 96)
    assert not levels_product.supported({"packed": True, "q_group_size": 64, "dequant_dtype": "bf16"}, 0)


@needs_kernel
@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_a16_matmul_decode_from_stored_levels_on_any_thread_count(threads: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A16MatMul's kernel on a weight held as stored (levels, bf16 scales, uint8 zeros) large enough to be
    split over threads: the fused kernel's bits are those of the specification's dequantizer and the
    one-row product."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", threads)
    rng = np.random.default_rng(7)
    n, k, group = 2048, 2048, 128
    levels, scale, zero = _weight(rng, n, k, group, 4)
    scale_raw = encode(scale, "bf16")
    attrs = {"packed": True, "q_group_size": group, "dequant_dtype": "bf16"}
    x = rng.standard_normal((1, 1, k)).astype(np.float32)
    got = KERNELS["A16MatMul"](attrs, x, StoredTensor(levels, "u8"), StoredTensor(scale_raw, "bf16"),
                               StoredTensor(zero, "u8"))
    scale_values = scale_raw.astype(np.uint32) << 16
    weight = specified_dequantize(attrs, levels, scale_values.view(np.float32), zero).astype(np.float32)
    assert np.array_equal(_bits(got.reshape(-1)), _bits(vector_product.reference(x.reshape(k), weight)))

"""The compiled bf16 store gives `formats.round_to(x, "bf16")`'s bits on every kind of float32 value, at every
length, and leaves its operand as it was; the host path's bf16 results go through it."""

from __future__ import annotations

import numpy as np
import pytest

from llmbuild.numerics import compiled_round
from llmbuild.numerics.formats import round_to
from llmbuild.runtime import host


def _awkward_values(n: int, seed: int) -> np.ndarray:
    """float32 values that meet every branch of the rounding: ties to even both ways, carries into the
    exponent, overflow to infinity, subnormals, signed zeros, infinities and NaNs of several payloads."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    special = np.array([0x00008000, 0x00018000, 0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x7F7F8000, 0xFF7FFFFF,
                        0x00000001, 0x80000000, 0x00000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001,
                        0x7F800001, 0x7FFFFFFF, 0x3F7FFFFF, 0x80008000], dtype=np.uint32)
    bits[: min(n, special.size)] = special[: min(n, special.size)]
    return bits.view(np.float32)


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 18, 576, 1000, 4099])
def test_the_compiled_store_gives_round_to_bits(n: int) -> None:
    if compiled_round.kernel() is None:
        pytest.skip("llvmlite cannot build the kernel here")
    x = _awkward_values(n, n)
    before = x.copy()
    with np.errstate(invalid="ignore", over="ignore"):
        want = round_to(x, "bf16")
    got = compiled_round.rounded_bf16(x)
    assert got.dtype == np.float32 and got.shape == x.shape and got.flags.c_contiguous
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(x.view(np.uint32), before.view(np.uint32))  # the operand is not written


def test_a_strided_view_is_rounded_as_its_values() -> None:
    """A kernel's result can be a transposed or sliced view of another array: read as its values."""
    x = _awkward_values(48 * 20, 3).reshape(48, 20)
    view = x.T[::2]
    with np.errstate(invalid="ignore", over="ignore"):
        want = round_to(np.ascontiguousarray(view), "bf16")
    assert np.array_equal(compiled_round.rounded_bf16(view).view(np.uint32), want.view(np.uint32))


def test_without_the_kernel_numpy_gives_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    x = _awkward_values(300, 5)
    with np.errstate(invalid="ignore", over="ignore"):
        compiled = compiled_round.rounded_bf16(x)
        monkeypatch.setattr(compiled_round, "kernel", lambda: None)
        fallback = compiled_round.rounded_bf16(x)
    assert np.array_equal(compiled.view(np.uint32), fallback.view(np.uint32))
    assert not np.shares_memory(fallback, x)


def test_the_host_path_stores_bf16_results_through_it() -> None:
    assert host._rounder("bf16", exact=False) is compiled_round.rounded_bf16


def test_finite_values_round_as_torch_rounds_to_bfloat16() -> None:
    """An independent reference: torch's own float32 -> bfloat16 conversion (round to nearest even), on every
    non-NaN value of the awkward set (NaN payloads are llmbuild's own rule: one canonical NaN)."""
    torch = pytest.importorskip("torch")
    if compiled_round.kernel() is None:
        pytest.skip("llvmlite cannot build the kernel here")
    x = _awkward_values(4099, 11)
    x = x[~np.isnan(x)]
    want = torch.from_numpy(x.copy()).to(torch.bfloat16).to(torch.float32).numpy()
    got = compiled_round.rounded_bf16(x)
    assert x.size > 4000 and np.isinf(want).any()  # overflow to infinity was among the cases
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))

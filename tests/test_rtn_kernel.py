"""The compiled 4-bit round-to-nearest gives numpy's levels and scales bit for bit (rtn._rtn4_block, the
incumbent's arithmetic), and leaves a weight that is not finite to numpy."""

from __future__ import annotations

import numpy as np
import pytest

from llmbuild.quant import rtn, rtn_kernel

pytest.importorskip("llvmlite")


def _numpy(w: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n, k = w.shape
    return rtn._rtn4_block(np.ascontiguousarray(w).reshape(n, k // g, g))


def _same(w: np.ndarray, g: int) -> None:
    got = rtn_kernel.rtn4(w, g)
    assert got is not None
    want = _numpy(w, g)
    assert np.array_equal(got[0], want[0])
    assert np.array_equal(got[1].view(np.uint32), want[1].view(np.uint32))
    assert np.array_equal(got[2], want[2])  # a zero point of -0.0 and one of 0.0 are the same level


def _hard_weights(rng: np.random.Generator, n: int, k: int, g: int) -> np.ndarray:
    """Groups made to meet every branch: constant (the range floor), tiny ranges, zeros of both signs, all
    negative, all positive, magnitudes from 1e-30 to 1e30, and quotients on and around half-integers."""
    w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
    groups = w.reshape(n, k // g, g)
    groups[0, 0] = 0.375
    groups[1, 0] = np.float32(1.0) + np.arange(g, dtype=np.float32) * np.float32(1e-7)
    groups[2, 0, ::2], groups[2, 0, 1::2] = -0.0, 0.0
    groups[3, 0] = -np.abs(groups[3, 0]) - 1
    groups[4, 0] = np.abs(groups[4, 0]) + 1
    groups[5, 0] *= np.float32(1e-30)
    groups[6, 0] *= np.float32(1e30)
    # [0, 15] in steps of 0.5 and one float either side: w / scale lands on and beside each half-integer.
    halves = np.arange(g, dtype=np.float32) % 31 / np.float32(2)
    for row, nudge in ((7, 0), (8, 1), (9, -1)):
        values = halves.copy()
        if nudge:
            values = np.nextafter(values, np.float32(np.inf * nudge)).astype(np.float32)
        values[0], values[-1] = 0, 15
        groups[row, 0] = values
    return w


@pytest.mark.parametrize("g", [16, 32, 64, 128])
def test_random_and_hard_weights_round_as_numpy_does(g: int) -> None:
    rng = np.random.default_rng(g)
    _same((rng.standard_normal((37, 4 * g)) * 0.05).astype(np.float32), g)
    _same(_hard_weights(rng, 12, 2 * g, g), g)


def test_every_quotient_around_every_half_integer() -> None:
    """A group of range 15 (scale 1): w / scale is w itself, so each float near each half-integer in
    [-1, 16] is rounded as numpy rounds it."""
    g = 64
    centres = np.arange(-2, 33, dtype=np.float32) / np.float32(2)
    values = np.array([np.nextafter(c, np.float32(d * np.inf)) if d else c for c in centres for d in (-1, 0, 1)],
                      dtype=np.float32)
    values = np.resize(values, (values.size + g - 1) // g * g).reshape(-1, g)
    values[:, 0], values[:, 1] = 0, 15  # min 0, max 15: scale exactly 1
    _same(values.reshape(-1, 2 * g), g)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_weight_not_finite_is_left_to_numpy(bad: float) -> None:
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((8, 128)) * 0.05).astype(np.float32)
    w[5, 70] = bad
    assert rtn_kernel.rtn4(w, 64) is None
    with np.errstate(invalid="ignore"):
        ql = rtn.rtn_quantize(w, 4, 64)  # numpy's passes, whatever they make of it
        want = _numpy(w, 64)
    assert np.array_equal(ql.q, want[0])


def test_rtn_quantize_takes_the_kernel() -> None:
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((64, 256)) * 0.05).astype(np.float32)
    ql = rtn.rtn_quantize(w, 4, 64)
    want = _numpy(w, 64)
    assert np.array_equal(ql.q, want[0]) and np.array_equal(ql.scale.view(np.uint32), want[1].view(np.uint32))
    assert not rtn_kernel.takes(w, 8) and not rtn_kernel.takes(w.astype(np.float64), 64)

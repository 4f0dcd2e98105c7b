"""DeltaLinear (the streamed reference's projection over cached levels) gives nn.Linear's bits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from llmbuild.verify.delta_linear import BLOCK_VALUES, DeltaLinear
from llmbuild.verify.stream_weights import LevelDeltas, dequantize_rows


def _deltas(n: int, k: int, group: int, seed: int) -> LevelDeltas:
    rng = np.random.default_rng(seed)
    delta = rng.integers(-8, 8, size=(n, k), dtype=np.int8)
    scale = (rng.random((n, k // group), dtype=np.float32) * 0.02 + 1e-3).astype(np.float32)
    return LevelDeltas(delta, scale, group)


# Real-size rows (a 1.5B's hidden 1536 and intermediate 8960, a 7B's 3584), several blocks and a ragged last
# one; 4-bit groups of 64 and 128, and one scale a row (8-bit); 300 rows (not a multiple of 64) take the
# whole weight.
SHAPES = [(576, 1536, 64), (192, 8960, 64), (512, 3584, 128), (256, 1536, 1536), (300, 3584, 128)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("n", "k", "group"), SHAPES)
def test_same_bits_as_linear_on_the_whole_weight(n: int, k: int, group: int, bias: bool, threads: int) -> None:
    deltas = _deltas(n, k, group, seed=n + k)
    assert n * k > BLOCK_VALUES  # blocked
    module = DeltaLinear(deltas, bias)
    b = torch.from_numpy(np.random.default_rng(1).standard_normal(n).astype(np.float32)) if bias else None
    if bias:
        module.bias = torch.nn.Parameter(b)
    weight = dequantize_rows(deltas)  # torch-allocated: 64-byte aligned, as the streamed layers' weights
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (1, 3, 40):  # a decode step (blocked), and rows products on the whole weight
            x = torch.from_numpy(np.random.default_rng(rows).standard_normal((1, rows, k)).astype(np.float32))
            with torch.no_grad():
                got, expected = module(x), F.linear(x, weight, b)
            assert got.shape == expected.shape == (1, rows, n)
            assert torch.isfinite(got).all()
            assert torch.equal(got, expected), (rows, (got - expected).abs().max())
    finally:
        torch.set_num_threads(before)

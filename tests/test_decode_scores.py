"""A decode step's attention in two compiled calls and one for the values (numerics/decode_scores.py,
weighted_lanes.weighted_row): the runs against `attention_rows.visible_runs`, the scores against the
products' numpy reference (vector_product.reference), and the whole row against decode_row's numpy path."""

from __future__ import annotations

import numpy as np
import pytest

from llmbuild.numerics import attention_rows, decode_scores, vector_product, weighted_lanes
from llmbuild.numerics.formats import mask_value

HIDDEN = np.float32(mask_value(""))
pytestmark = pytest.mark.skipif(not decode_scores.available(64) or not weighted_lanes.row_available(1, 64),
                                reason="llvmlite cannot build the kernels")


def _runs(found: np.ndarray) -> list[tuple[int, int]]:
    return [(int(found[2 + 2 * i]), int(found[3 + 2 * i])) for i in range(int(found[0]))]


def _random_mask(rng: np.random.Generator, keys: int) -> np.ndarray:
    mask = np.full(keys, HIDDEN, dtype=np.float32)
    for _ in range(int(rng.integers(0, 5))):
        a = int(rng.integers(0, keys))
        mask[a : int(rng.integers(a, min(keys, a + 150) + 1))] = rng.choice([0.0, -3.0, np.nan])
    return mask


def test_the_runs_are_the_visible_runs_and_their_keys_counted():
    rng = np.random.default_rng(3)
    for keys in [1, 63, 64, 65, *rng.integers(1, 1200, 500).tolist()]:
        mask = _random_mask(rng, keys)
        found = decode_scores.runs(mask, float(HIDDEN))
        assert _runs(found) == attention_rows.visible_runs(mask)
        assert int(found[1]) == sum(stop - start for start, stop in _runs(found))


def _numpy_path(monkeypatch: pytest.MonkeyPatch, *args: object) -> np.ndarray:
    with monkeypatch.context() as patch:
        patch.setattr(decode_scores, "available", lambda d: False)
        return attention_rows.decode_row(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize("keys, kv_heads, group, d", [
    (513, 3, 3, 64),    # SmolLM2
    (2049, 2, 6, 128),  # the 1.5B
    (513, 4, 7, 128),   # the 7B: 2 vectors a pass in the lanes
    (300, 2, 8, 80),    # the most rows a lanes kernel holds; a d of 5 vectors (lanes 16-63 one product less)
    (70, 1, 1, 16),     # one query head, fewer keys than two blocks
    (200, 2, 4, 96),
])
def test_a_compiled_decode_row_has_the_numpy_paths_bits(monkeypatch, keys, kv_heads, group, d):
    rng = np.random.default_rng(keys + d)
    heads = kv_heads * group
    for trial in range(12):
        q = rng.standard_normal((1, 1, heads, d), dtype=np.float32)
        k = rng.standard_normal((1, keys, kv_heads, d), dtype=np.float32) * np.float32(rng.choice([0.1, 1, 30]))
        v = rng.standard_normal((1, keys, kv_heads, d), dtype=np.float32)
        mask = _random_mask(rng, keys)[None, None, None]
        if trial % 3 == 0:  # a decode step's: the history, the empty cache, the new row
            mask[...] = HIDDEN
            mask[..., : int(rng.integers(0, keys))] = 0
            mask[..., -1] = 0
        if trial % 4 == 1:
            k[0, int(rng.integers(0, keys)), 0, int(rng.integers(0, d))] = rng.choice([np.nan, np.inf])
            v[0, int(rng.integers(0, keys)), kv_heads - 1, 3] = np.nan
        scale = np.float32(d**-0.5)
        with np.errstate(invalid="ignore"):  # an infinite score less the infinite maximum: NaN, in both paths
            got = attention_rows.decode_row(q, k, v, mask, scale)
            expected = _numpy_path(monkeypatch, q, k, v, mask, scale)
        assert got.shape == (1, 1, heads * d) and got.dtype == np.float32
        assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_the_scores_are_the_products_reference_scaled_and_masked():
    rng = np.random.default_rng(5)
    keys, kv_heads, group, d = 700, 2, 3, 96
    q = rng.standard_normal((kv_heads * group, d), dtype=np.float32)
    k = rng.standard_normal((keys, kv_heads, d), dtype=np.float32)
    mask = np.full(keys, HIDDEN, dtype=np.float32)
    mask[:150] = 0
    mask[400:410] = -2.5
    mask[-1] = 0
    found = decode_scores.runs(mask, float(HIDDEN))
    kept = np.concatenate([np.arange(start, stop) for start, stop in _runs(found)])
    scale = np.float32(0.1)
    got = decode_scores.scores(q, k, found, mask, scale)
    for h in range(kv_heads):
        for g in range(group):
            expected = vector_product.reference(q[h * group + g], k[kept, h]) * scale + mask[kept]
            assert np.array_equal(got[h, g], expected)


def test_a_group_larger_than_a_lanes_kernel_keeps_the_numpy_path(monkeypatch):
    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 1, 9, 64), dtype=np.float32)
    k = rng.standard_normal((1, 130, 1, 64), dtype=np.float32)
    v = rng.standard_normal((1, 130, 1, 64), dtype=np.float32)
    mask = np.zeros((1, 1, 1, 130), dtype=np.float32)
    assert not weighted_lanes.row_available(9, 64)
    got = attention_rows.decode_row(q, k, v, mask, np.float32(0.125))
    assert np.array_equal(got, _numpy_path(monkeypatch, q, k, v, mask, np.float32(0.125)))

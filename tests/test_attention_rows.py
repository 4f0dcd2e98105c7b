"""Attention in the products' defined arithmetic (numerics/attention_rows.py, run by the executors' FAttention
kernel and its flash blocks): a real row's bits never depend on the rows beside it nor on the keys the mask
hides, and the values are a float64 softmax's."""

from __future__ import annotations

import numpy as np
import pytest

from llmbuild.numerics import attention_rows, matrix_product
from llmbuild.numerics.formats import mask_value
from llmbuild.numerics.kernels import KERNELS, flash_block, flash_end
from llmbuild.op_defs.fattention import spec

HIDDEN = np.float32(mask_value(""))


def _operands(rng: np.random.Generator, mq: int, mk: int, heads: int, kv_heads: int, d: int):
    q = rng.standard_normal((1, mq, heads, d)).astype(np.float32)
    k = rng.standard_normal((1, mk, kv_heads, d)).astype(np.float32)
    v = rng.standard_normal((1, mk, kv_heads, d)).astype(np.float32)
    return q, k, v


def _causal(mq: int, mk: int, history: int) -> np.ndarray:
    """A prefill on `history` earlier keys: row r sees keys [0, history + r]."""
    mask = np.full((1, 1, mq, mk), HIDDEN, dtype=np.float32)
    for r in range(mq):
        mask[0, 0, r, : min(mk, history + r + 1)] = 0
    return mask


def _every_key(attrs: dict, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The same arithmetic over every row and every key, in numpy (matrix_product.reference): the device's
    whole computation, with nothing left out."""
    _, mq, heads, d = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    out = np.empty((mq, heads * d), dtype=np.float32)
    for h in range(kv_heads):
        x = np.ascontiguousarray(q[0, :, h * group : (h + 1) * group].transpose(1, 0, 2)).reshape(-1, d)
        scores = matrix_product.reference(x, k[0, :, h]).reshape(group, mq, -1)
        scores *= np.float32(attrs["scale"])
        scores += mask[0, 0]
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        weights = scores.reshape(group * mq, -1)
        values_and_one = np.concatenate([v[0, :, h].T, np.ones((1, k.shape[1]), np.float32)])
        summed = matrix_product.reference(weights, values_and_one)
        values = (summed[:, :d] / summed[:, d:]).reshape(group, mq, d)
        out[:, h * group * d : (h + 1) * group * d] = values.transpose(1, 0, 2).reshape(mq, group * d)
    return out


@pytest.mark.parametrize("mq, mk, history, real, heads, kv_heads, d", [
    (128, 128, 0, 37, 9, 3, 64),    # SmolLM2's prefill of a 37-token prompt
    (64, 200, 136, 5, 4, 2, 128),   # a prefill on a history, keys past the prompt's hidden
    (16, 16, 0, 16, 4, 4, 72),      # every row real, a head size no multiple of 64 (SigLIP's)
])
def test_the_real_rows_have_the_bits_of_every_row_against_every_key(mq, mk, history, real, heads, kv_heads, d):
    rng = np.random.default_rng(mq + mk)
    q, k, v = _operands(rng, mq, mk, heads, kv_heads, d)
    mask = _causal(mq, mk, history)
    attrs = {"scale": d**-0.5, "kv_head": kv_heads, "q_head": heads}
    got = KERNELS["FAttention"]({**attrs, "active_rows": real}, q, k, v, mask)
    whole = KERNELS["FAttention"](attrs, q, k, v, mask)
    assert np.array_equal(got[0, :real], whole[0, :real])
    assert not got[0, real:].any()
    assert np.array_equal(whole[0], _every_key(attrs, q, k, v, mask))
    reference = spec(attrs, *(a.astype(np.float64) for a in (q, k, v, mask)))
    assert np.abs(got[0, :real] - reference[0, :real]).max() < 1e-5


def test_a_decode_step_leaves_out_the_empty_cache_between_history_and_new_row():
    """The decode net's keys: 40 of history, 472 empty slots, the new row last (index 512), in a key block."""
    rng = np.random.default_rng(7)
    q, k, v = _operands(rng, 1, 513, 9, 3, 64)
    k[0, 40:512], v[0, 40:512] = 1e4, -1e4  # what the empty slots hold must not matter
    mask = np.full((1, 1, 1, 513), HIDDEN, dtype=np.float32)
    mask[0, 0, 0, :40] = mask[0, 0, 0, 512] = 0
    kept = attention_rows.visible_keys(mask[0, 0])
    assert list(kept) == [*range(64), 512]
    attrs = {"scale": 0.125}
    got = flash_end(flash_block(attrs, q, k, v, mask))
    assert np.array_equal(got[0], _every_key(attrs, q, k, v, mask))


def test_a_key_block_shown_to_no_row_moves_no_other_key_to_another_lane():
    mask = np.full((2, 300), HIDDEN, dtype=np.float32)
    mask[0, 70:75] = mask[1, 200:203] = 0
    kept = attention_rows.visible_keys(mask)
    assert list(kept) == [*range(64, 128), *range(192, 203)]
    assert all(key % 64 == column % 64 for column, key in enumerate(kept))
    assert attention_rows.visible_keys(np.full((2, 100), HIDDEN, dtype=np.float32)) == slice(0, 100)


def test_the_executors_kernel_takes_it_for_float32_and_keeps_numpy_for_the_float64_reference():
    rng = np.random.default_rng(3)
    q, k, v = _operands(rng, 8, 8, 4, 2, 64)
    mask = _causal(8, 8, 0)
    attrs = {"scale": 0.125, "kv_head": 2, "q_head": 4}
    assert np.array_equal(KERNELS["FAttention"](attrs, q, k, v, mask)[0], _every_key(attrs, q, k, v, mask))
    as64 = [a.astype(np.float64) for a in (q, k, v, mask)]
    assert not attention_rows.supported(*as64)
    assert KERNELS["FAttention"](attrs, *as64).dtype == np.float64


def test_a_nan_in_a_shown_key_reaches_the_output():
    rng = np.random.default_rng(5)
    q, k, v = _operands(rng, 4, 4, 2, 1, 64)
    v[0, 1, 0, 3] = np.nan
    out = KERNELS["FAttention"]({"scale": 0.125, "kv_head": 1, "q_head": 2}, q, k, v, _causal(4, 4, 0))
    assert np.isnan(out[0, 1:, 3]).all()  # every row that sees key 1


def _decode_mask(keys: int, history: int) -> np.ndarray:
    """A decode step's mask: `history` keys, the empty cache, the new row last."""
    mask = np.full((1, 1, 1, keys), HIDDEN, dtype=np.float32)
    mask[0, 0, 0, :history] = mask[0, 0, 0, -1] = 0
    return mask


@pytest.mark.parametrize("keys, history, heads, kv_heads, d", [
    (513, 40, 9, 3, 64),      # SmolLM2's step on a short history: the runs gathered into one copy
    (2049, 300, 12, 2, 128),  # the 1.5B's: two runs read in place
    (2049, 2048, 12, 2, 128),  # a full cache: one run
    (130, 70, 4, 4, 72),      # a head size no multiple of 64
    (1, 0, 2, 1, 64),         # nothing but the new row
])
def test_a_decode_row_has_the_bits_of_the_flash_block_and_of_every_key(keys, history, heads, kv_heads, d):
    rng = np.random.default_rng(keys + history)
    q, k, v = _operands(rng, 1, keys, heads, kv_heads, d)
    k[0, history:-1], v[0, history:-1] = 1e4, -1e4  # what the empty slots hold must not matter
    mask = _decode_mask(keys, history)
    attrs = {"scale": d**-0.5, "kv_head": kv_heads, "q_head": heads}
    got = attention_rows.decode_row(q, k, v, mask, np.float32(attrs["scale"]))
    assert np.array_equal(got[0], flash_end(flash_block(attrs, q, k, v, mask))[0])
    assert np.array_equal(got[0], _every_key(attrs, q, k, v, mask))
    assert np.array_equal(KERNELS["FAttention"](attrs, q, k, v, mask), got)  # the executors' kernel takes it


def test_a_decode_row_carries_a_nan_of_a_shown_key_and_ignores_one_in_a_hidden_block():
    rng = np.random.default_rng(11)
    q, k, v = _operands(rng, 1, 1025, 4, 2, 64)
    mask = _decode_mask(1025, 400)
    v[0, 700, 0, 5] = np.nan  # an empty slot of a block no key of which is shown
    clean = attention_rows.decode_row(q, k, v, mask, np.float32(0.125))
    assert np.isfinite(clean).all()
    v[0, 10, 1, 5] = np.nan  # a history key of KV head 1
    out = attention_rows.decode_row(q, k, v, mask, np.float32(0.125))
    assert np.isnan(out[0, 0, 2 * 64 + 5]) and np.isnan(out[0, 0, 3 * 64 + 5])  # its two query heads
    assert np.array_equal(out[0, 0, : 2 * 64], clean[0, 0, : 2 * 64])  # KV head 0's rows untouched


def test_a_decode_rows_key_runs_are_the_visible_keys():
    rng = np.random.default_rng(2)
    for _ in range(500):
        keys = int(rng.integers(1, 700))
        mask = np.full(keys, HIDDEN, dtype=np.float32)
        for _ in range(int(rng.integers(0, 5))):
            a = int(rng.integers(0, keys))
            mask[a : int(rng.integers(a, min(keys, a + 150) + 1))] = rng.choice([0.0, -3.0])
        kept = attention_rows.visible_keys(mask[None])
        expected = list(range(keys))[kept] if isinstance(kept, slice) else kept.tolist()
        assert [key for start, stop in attention_rows.visible_runs(mask) for key in range(start, stop)] == expected

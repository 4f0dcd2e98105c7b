"""Each op's numpy semantics against an independent implementation (torch / transformers)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from llmbuild.numerics import formats
from llmbuild.numerics.kernels import KERNELS

rng = np.random.default_rng(0)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float64)


def test_rmsnorm_matches_transformers():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    # LlamaRMSNorm computes in float32 whatever the input dtype, so compare in float32.
    x, g = randn(1, 5, 32).astype(np.float32), randn(32).astype(np.float32)
    norm = LlamaRMSNorm(32, eps=1e-6)
    norm.weight.data = torch.tensor(g)
    want = norm(torch.tensor(x)).detach().numpy()
    got = KERNELS["RMSNorm"]({"eps": 1e-6}, x, g)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("bias", [True, False])
def test_matmul_right_transpose_is_linear(bias):
    x, w, b = randn(1, 4, 16), randn(8, 16), randn(8)
    want = F.linear(torch.tensor(x), torch.tensor(w), torch.tensor(b) if bias else None).numpy()
    got = KERNELS["MatMul"]({"right_transpose": True, "do_relu": False}, x, w, *([b] if bias else []))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    got_plain = KERNELS["MatMul"]({"right_transpose": False, "do_relu": False}, x, w.T.copy())
    np.testing.assert_allclose(got_plain, x @ w.T, rtol=1e-12)


@pytest.mark.parametrize("tiles", [{}, {"tile_m": 16}, {"tile_n": 96}, {"tile_m": 48, "tile_n": 160}])
def test_products_have_the_same_bits_on_any_thread_count(tiles, monkeypatch):
    """A prefill-sized product: BLAS alone gives other bits on other thread counts; the defined arithmetic
    (numerics/matrix_product.py) gives one answer on 1, 2 or 3 threads whatever the tiles, and that answer
    is the float64 product to within float32 rounding."""
    from llmbuild.numerics.parallel import one_thread

    x = randn(1, 100, 576).astype(np.float32)
    w = randn(320, 576).astype(np.float32)
    attrs = {"right_transpose": True, "do_relu": False, **tiles}
    got = []
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", threads)
        with one_thread():
            got.append(KERNELS["MatMul"](attrs, x, w))
    assert np.array_equal(got[0], got[1]) and np.array_equal(got[0], got[2])
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-3)


def test_rope_matches_transformers():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q, k = randn(1, 6, 4, 16), randn(1, 6, 2, 16)
    ang = randn(1, 6, 16)
    cos, sin = np.cos(ang), np.sin(ang)
    # transformers uses [B, heads, L, d] and unsqueezes cos/sin at dim 1
    tq, tk = apply_rotary_pos_emb(
        torch.tensor(q).transpose(1, 2), torch.tensor(k).transpose(1, 2), torch.tensor(cos), torch.tensor(sin)
    )
    got_q = KERNELS["Rope"]({}, q, cos[:, :, None], sin[:, :, None])
    got_k = KERNELS["Rope"]({}, k, cos[:, :, None], sin[:, :, None])
    np.testing.assert_allclose(got_q, tq.transpose(1, 2).numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_k, tk.transpose(1, 2).numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mq,mk", [(5, 5), (1, 9), (3, 11)])
def test_grouped_query_attention_matches_sdpa(mq, mk):
    q, k, v = randn(1, mq, 6, 8), randn(1, mk, 2, 8), randn(1, mk, 2, 8)
    mask = np.where(rng.random((1, 1, mq, mk)) < 0.3, -9984.0, 0.0)
    mask[..., 0] = 0.0
    attrs = {"scale": 8**-0.5, "kv_head": 2, "q_head": 6}
    got = KERNELS["FAttention"](attrs, q, k, v, mask)
    tk = torch.tensor(k).transpose(1, 2).repeat_interleave(3, dim=1)
    tv = torch.tensor(v).transpose(1, 2).repeat_interleave(3, dim=1)
    want = F.scaled_dot_product_attention(
        torch.tensor(q).transpose(1, 2), tk, tv, attn_mask=torch.tensor(mask), scale=8**-0.5
    )
    np.testing.assert_allclose(got, want.transpose(1, 2).reshape(1, mq, 48).numpy(), rtol=1e-10, atol=1e-12)


def test_elementwise_gather_concat_softmax():
    a, b = randn(2, 3), randn(2, 3)
    np.testing.assert_allclose(KERNELS["Add"]({}, a, b), a + b)
    np.testing.assert_allclose(KERNELS["Mul"]({}, a, b), a * b)
    np.testing.assert_allclose(KERNELS["SiLU"]({}, a), F.silu(torch.tensor(a)).numpy(), rtol=1e-12)
    np.testing.assert_allclose(KERNELS["Active"]({"mode": "SILU"}, a), F.silu(torch.tensor(a)).numpy())
    np.testing.assert_allclose(KERNELS["Softmax"]({"axis": -1}, a), torch.softmax(torch.tensor(a), -1).numpy())
    np.testing.assert_array_equal(KERNELS["Concat"]({"axis": 1}, a, b), np.concatenate([a, b], 1))
    table, ids = randn(10, 4), np.array([[3, 0, 9]], dtype=np.int32)
    want = F.embedding(torch.tensor(ids, dtype=torch.long), torch.tensor(table)).numpy()
    np.testing.assert_array_equal(KERNELS["Gather"]({"axis": 0}, table, ids), want)
    with pytest.raises(IndexError):
        KERNELS["Gather"]({"axis": 0}, table, np.array([[10]]))
    np.testing.assert_array_equal(KERNELS["Permute"]({"order": [1, 0]}, a), a.T)
    np.testing.assert_array_equal(KERNELS["Reshape"]({"shape": [3, 2]}, a), a.reshape(3, 2))


def test_bf16_rounding_is_torch_bit_exact():
    x = np.concatenate([rng.standard_normal(10000) * 10 ** rng.uniform(-8, 8, 10000),
                        [0.0, -0.0, 1.0, 65504.0, 3.0e38, 1e-40]]).astype(np.float32)
    want = torch.tensor(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(formats.f32_to_bf16_bits(x), want)
    back = torch.tensor(x).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(formats.round_to(x, "bf16"), back)


def test_f16_round_trip_and_mask_value_is_exact():
    for dtype in ("bf16", "f16"):
        assert formats.round_to(np.array([formats.mask_value(dtype)], np.float32), dtype)[0] == -9984.0
    x = rng.standard_normal(100).astype(np.float32)
    np.testing.assert_array_equal(formats.decode(formats.encode(x, "f16"), "f16"), x.astype(np.float16))


def test_a16_gather_is_gather_of_the_dequantized_table() -> None:
    """The quantized embedding lookup: rows of ((q - zp) * scale), packed 4-bit or 8-bit, per group."""
    from llmbuild.numerics.kernels import KERNELS

    rng = np.random.default_rng(3)
    V, H, g = 40, 16, 8
    q = rng.integers(0, 16, size=(V, H)).astype(np.uint8)
    scale = rng.uniform(0.01, 0.1, size=(V, H // g)).astype(np.float32)
    zp = rng.integers(0, 16, size=(V, H // g)).astype(np.uint8)
    ids = np.array([[3, 39, 0, 3]], dtype=np.int32)
    table = (q.astype(np.float64) - np.repeat(zp, g, axis=1)) * np.repeat(scale, g, axis=1)
    packed = q[:, 0::2] | (q[:, 1::2] << 4)
    got = KERNELS["A16Gather"]({"q_group_size": g, "packed": True}, packed, scale, zp, ids)
    np.testing.assert_allclose(got, table[ids], rtol=1e-6)
    assert got.shape == (1, 4, H)
    with pytest.raises(IndexError):
        KERNELS["A16Gather"]({"q_group_size": g}, q, scale, zp, np.array([[V]]))

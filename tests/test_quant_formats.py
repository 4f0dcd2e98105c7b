"""Quantized checkpoint readers, the incumbent's RTN and the device packing, on real library fixtures.

The fixtures (tests/fixtures/quant/, built by make_fixtures.py with gptqmodel, autoawq, auto-round and
llmcompressor) are read by `llmbuild.quant` and compared with (1) a dequantization written here from
the formats as the libraries define them, without calling llmbuild's unpacking, and
(2) the library's own dequantization saved beside each fixture (reference_dequant.safetensors).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from llmbuild import LlmbuildError
from llmbuild.numerics.dequantize import unpack_nibbles
from llmbuild.quant import (
    DictTensors,
    QuantizedCheckpoint,
    QuantizedLinear,
    detect_quantization,
    pack,
    read_linear,
    rtn_quantize,
    unpack,
)
from llmbuild.quant.pack import pack_levels
from llmbuild.quant.rtn import round_half_away, round_near_half_away_inplace

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "quant"
# name -> (layout, bits, sym, desc_act, group_size, zeros stored minus one), the expectations a reader of
# each library's format must meet; written from the libraries' configs, not from llmbuild.
EXPECTED = {
    "gptq_sym_g32": ("gptq", 4, True, False, 32, True),
    "gptq_asym_g32": ("gptq", 4, False, False, 32, True),
    "gptq_sym_actorder_g32": ("gptq", 4, True, True, 32, True),
    "gptq_asym_actorder_g32": ("gptq", 4, False, True, 32, True),
    "gptq_v2_asym_actorder_g32": ("gptq", 4, False, True, 32, False),
    "gptq_8bit_sym_g32": ("gptq", 8, True, False, 32, True),
    "awq_gemm_g32": ("awq", 4, False, False, 32, False),
    "gptq_qwen3_sym_g32": ("gptq", 4, True, False, 32, True),  # a Qwen3: q/k norms beside the packed tensors
    "awq_gemm_qwen3_g32": ("awq", 4, False, False, 32, False),
    "autoround_sym_g32": ("gptq", 4, True, False, 32, True),  # auto_round:auto_gptq packing
    "autoround_asym_g32": ("awq", 4, False, False, 32, False),  # auto_round:auto_awq packing
    "autoround_asym_auto_gptq_g32": ("gptq", 4, False, False, 32, True),
    "autoround_sym_auto_awq_g32": ("awq", 4, True, False, 32, False),
    "ct_pack_sym_g32": ("pack-quantized", 4, True, False, 32, False),
    "ct_pack_asym_g32": ("pack-quantized", 4, False, False, 32, False),
    "ct_pack_sym_channel": ("pack-quantized", 4, True, False, -1, False),
}
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # fmt: skip
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def fixture_names() -> list[str]:
    return sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file())


def test_every_fixture_is_expected() -> None:
    assert fixture_names() == sorted(EXPECTED)


# --- the independent dequantization (format facts only) ------------------------------------------------


def load_np(path: Path, names: list[str]) -> dict[str, np.ndarray]:
    with safe_open(str(path), framework="np") as f:
        available = set(f.keys())  # noqa: SIM118 (safe_open is not a dict)
        return {n: f.get_tensor(n) for n in names if n in available}


def spec_dequant(fixture: str, prefix: str) -> np.ndarray:
    """float32 [N, K] from the raw tensors, per quant-formats.md, element by element in the packing."""
    layout, bits, sym, _desc_act, group, minus_one = EXPECTED[fixture]
    mask, per_word = (1 << bits) - 1, 32 // bits
    suffixes = ["qweight", "qzeros", "scales", "g_idx", "weight_packed", "weight_scale", "weight_zero_point"]
    t = load_np(FIXTURES / fixture / "model.safetensors", [f"{prefix}.{s}" for s in suffixes])
    t = {k.rsplit(".", 1)[1]: v for k, v in t.items()}

    def field(word: np.ndarray, pos: int | np.ndarray) -> np.ndarray:
        return (word.astype(np.uint32) >> (bits * np.asarray(pos)).astype(np.uint32)) & mask

    if layout == "gptq":  # qweight [K/pf, N] along K; qzeros [K/g, N/pf] along N; scales [K/g, N]
        k_dim, n_dim = t["qweight"].shape[0] * per_word, t["qweight"].shape[1]
        q = np.stack([field(t["qweight"][k // per_word], k % per_word) for k in range(k_dim)], axis=1)
        zeros = np.stack([field(t["qzeros"][:, n // per_word], n % per_word) for n in range(n_dim)], axis=0)
        zeros = zeros.astype(np.float32) + (1 if minus_one else 0)  # [N, G]
        scales = t["scales"].astype(np.float32).T  # [N, G]
        g = k_dim if group == -1 else group
        g_idx = t["g_idx"] if "g_idx" in t else np.arange(k_dim) // g
    elif layout == "awq":  # qweight [K, N/8], column 8w+j at nibble AWQ_ORDER.index(j)
        k_dim, n_dim = t["qweight"].shape[0], t["qweight"].shape[1] * 8
        pos = [AWQ_ORDER.index(n % 8) for n in range(n_dim)]
        q = np.stack([field(t["qweight"][:, n // 8], pos[n]) for n in range(n_dim)], axis=0)
        zeros = np.stack([field(t["qzeros"][:, n // 8], pos[n]) for n in range(n_dim)], axis=0).astype(np.float32)
        scales = t["scales"].astype(np.float32).T
        g_idx = np.arange(k_dim) // group
    else:  # pack-quantized: weight_packed [N, K/pf] along K, signed + 2^(bits-1)
        n_dim, k_dim = t["weight_packed"].shape[0], t["weight_packed"].shape[1] * per_word
        q = np.stack([field(t["weight_packed"][:, k // per_word], k % per_word) for k in range(k_dim)], axis=1)
        scales = t["weight_scale"].astype(np.float32)
        if sym:
            zeros = np.full(scales.shape, 1 << (bits - 1), dtype=np.float32)
        else:  # zero points packed along N like the weights along K
            zp = t["weight_zero_point"]
            zeros = np.stack([field(zp[n // per_word], n % per_word) for n in range(n_dim)]).astype(np.float32)
        g = k_dim if group == -1 else group
        g_idx = np.arange(k_dim) // g
    assert q.shape == (n_dim, k_dim)
    w = np.empty((n_dim, k_dim), dtype=np.float32)
    for k in range(k_dim):
        w[:, k] = (q[:, k].astype(np.float32) - zeros[:, g_idx[k]]) * scales[:, g_idx[k]]
    return w


def prefixes() -> list[str]:
    return [f"model.layers.0.{name}" for name in LINEARS]


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_config_detected(fixture: str) -> None:
    layout, bits, sym, desc_act, group, minus_one = EXPECTED[fixture]
    config = json.loads((FIXTURES / fixture / "config.json").read_text())
    info = detect_quantization(config)
    assert (info.layout, info.bits, info.sym, info.desc_act, info.group_size) == (layout, bits, sym, desc_act, group)
    assert info.zero_offset == (1 if minus_one else 0)


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_fixture_equals_spec_and_library(fixture: str) -> None:
    ckpt = QuantizedCheckpoint(FIXTURES / fixture)
    assert sorted(ckpt.linear_prefixes()) == sorted(prefixes())
    ref_path = FIXTURES / fixture / "reference_dequant.safetensors"
    library = load_np(ref_path, [p + ".weight" for p in prefixes()])
    assert len(library) == len(LINEARS)
    for prefix in prefixes():
        ql = ckpt.linear(prefix)
        assert (ql.out_features, ql.in_features) == ckpt.expected_shape(prefix)
        ours = ql.dequantize()
        np.testing.assert_array_equal(ours, spec_dequant(fixture, prefix), err_msg=f"{fixture} {prefix} vs spec")
        ref = library[prefix + ".weight"]
        scale = float(np.abs(ref).max())
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6 * scale, err_msg=f"{fixture} {prefix} vs library")


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_pack_is_lossless(fixture: str) -> None:
    """Device layout: nibbles as specified, and unpacking gives back every level, scale and zero point
    (in the device's input order: act-order layers permute K and leave nothing else changed)."""
    ckpt = QuantizedCheckpoint(FIXTURES / fixture)
    desc_act = EXPECTED[fixture][3]
    rng = np.random.default_rng(0)
    for prefix in prefixes():
        ql = ckpt.linear(prefix)
        dw = pack(ql)
        assert (dw.perm is not None) == desc_act  # every act-order layer here has a real permutation
        perm = np.arange(ql.in_features) if dw.perm is None else dw.perm
        q_dev = ql.q[:, perm]
        if ql.bits == 4:
            assert dw.weight.shape == (ql.out_features, ql.in_features // 2)
            for j in range(0, ql.in_features, 2):  # even k low nibble, odd k high nibble
                np.testing.assert_array_equal(dw.weight[:, j // 2], q_dev[:, j] + 16 * q_dev[:, j + 1])
        else:
            np.testing.assert_array_equal(dw.weight, q_dev)
        assert dw.zp.dtype == np.uint8 and dw.zp.shape == dw.scale.shape == (ql.out_features, ql.num_groups)
        # Each device group is contiguous: inputs j*g .. j*g+g-1 all come from checkpoint group j.
        np.testing.assert_array_equal(ql.group_index()[perm], np.arange(ql.in_features) // ql.group_size)
        back = unpack(dw)
        assert back.g_idx is None
        np.testing.assert_array_equal(back.dequantize(), ql.dequantize()[:, perm])
        x = rng.standard_normal((3, ql.in_features))
        y = x @ ql.dequantize().astype(np.float64).T
        y_dev = dw.permute_activations(x) @ back.dequantize().astype(np.float64).T
        np.testing.assert_allclose(y_dev, y, rtol=1e-12, atol=1e-12)


def test_unpack_nibbles_gives_every_byte_s_two_levels() -> None:
    """Every byte value, from a strided (non-contiguous) view too: the low nibble is the even k."""
    packed = np.arange(512, dtype=np.uint16).astype(np.uint8).reshape(4, 128)
    for source in (packed, np.asfortranarray(packed), packed[:, ::-1][:, ::-1]):
        levels = unpack_nibbles(source)
        assert levels.shape == (4, 256) and levels.dtype == np.uint8
        np.testing.assert_array_equal(levels[:, 0::2], packed & 0xF)
        np.testing.assert_array_equal(levels[:, 1::2], packed >> 4)
        np.testing.assert_array_equal(pack_levels(levels, 4, "test"), packed)


def test_pack_levels_pairs_read_as_words_equal_the_nibble_formula() -> None:
    """The packing by uint16 pairs against lo | (hi << 4) over every pair of byte values (those past 15
    included: the high nibble keeps hi's low four bits), contiguous, strided and Fortran-ordered."""
    lo, hi = np.meshgrid(np.arange(256, dtype=np.uint8), np.arange(256, dtype=np.uint8))
    levels = np.stack([lo.reshape(-1), hi.reshape(-1)], axis=1).reshape(256, 512)
    expected = (levels[:, 0::2] | (levels[:, 1::2] << 4)).astype(np.uint8)
    wide = np.repeat(levels, 2, axis=0)[::2]  # a view with a row stride of two rows
    for source in (levels, wide, np.asfortranarray(levels)):
        np.testing.assert_array_equal(pack_levels(source, 4, "test"), expected)


def test_act_order_permutation_is_stable_sort() -> None:
    g_idx = np.array([1, 0, 1, 0, 0, 1], dtype=np.int32)
    q = np.arange(12, dtype=np.uint8).reshape(2, 6)
    ql = QuantizedLinear(q=q, scale=np.ones((2, 2), np.float32), zero=np.zeros((2, 2), np.float32),
                         group_size=3, bits=4, g_idx=g_idx)  # fmt: skip
    dw = pack(ql)
    np.testing.assert_array_equal(dw.perm, [1, 3, 4, 0, 2, 5])
    uneven = QuantizedLinear(q=q, scale=np.ones((2, 2), np.float32), zero=np.zeros((2, 2), np.float32),
                             group_size=3, bits=4, g_idx=np.array([0, 0, 0, 0, 1, 1], np.int32))  # fmt: skip
    with pytest.raises(LlmbuildError, match="group 0 has 4 input rows, expected 3"):
        pack(uneven)


def test_gptq_v1_zero_of_zero_survives_the_word_level_offset() -> None:
    """gptqmodel writes v1 zeros by subtracting 0x11111111 from each int32 word (a zero of 0 borrows from
    its neighbour) and reads them by adding it back; the reader must recover every zero exactly."""
    zeros = np.array([[0, 3, 0, 15, 8, 0, 1, 0]], dtype=np.int64)  # one group, N = 8
    word = sum(int(z) << (4 * j) for j, z in enumerate(zeros[0]))
    stored = (word - 0x11111111) % (1 << 32)
    k, n = 8, 8
    rng = np.random.default_rng(1)
    q = rng.integers(0, 16, size=(k, n))
    qweight = np.array([[sum(int(q[r, c]) << (4 * r) for r in range(8)) for c in range(n)]], dtype=np.int64)
    tensors = DictTensors({
        "l.qweight": qweight.astype(np.uint32).view(np.int32),
        "l.qzeros": np.array([[stored]], dtype=np.uint32).view(np.int32),
        "l.scales": np.full((1, n), 0.5, dtype=np.float16),
    })  # fmt: skip
    info = detect_quantization({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": -1,
                                                        "sym": False, "checkpoint_format": "gptq"}})  # fmt: skip
    ql = read_linear(tensors, "l", info)
    np.testing.assert_array_equal(ql.zero[:, 0], zeros[0])
    np.testing.assert_array_equal(ql.q, q.T)


# --- the incumbent's RTN, against an element-by-element implementation -------------------------------------


def c_round(x: float) -> int:
    """std::round: ties away from zero (exact for float32 inputs in float64)."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def rtn4_reference(w: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n, k = w.shape
    q = np.zeros((n, k), np.uint8)
    scale = np.zeros((n, k // g), np.float32)
    zp = np.zeros((n, k // g), np.float32)
    for r in range(n):
        for j in range(k // g):
            group = [np.float32(v) for v in w[r, j * g : (j + 1) * g]]
            lo, hi = min(group), max(group)
            s = np.float32(max(np.float32(hi - lo), np.float32(1e-5)) / np.float32(15))
            z = min(max(-c_round(float(np.float32(lo / s))), 0), 15)
            scale[r, j], zp[r, j] = s, z
            for i, v in enumerate(group):
                q[r, j * g + i] = min(max(c_round(float(np.float32(v / s))) + z, 0), 15)
    return q, scale, zp


def rtn8_reference(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n, k = w.shape
    q = np.zeros((n, k), np.uint8)
    scale = np.zeros((n, 1), np.float32)
    for r in range(n):
        s = np.float32(max(np.float32(np.abs(w[r]).max()), np.float32(1e-5)) / np.float32(127))
        scale[r, 0] = s
        for i in range(k):
            q[r, i] = min(max(c_round(float(np.float32(np.float32(w[r, i]) / s))), -128), 127) + 128
    return q, scale


def rtn_weights() -> np.ndarray:
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((6, 128)) * 0.05).astype(np.float32)
    w[1, :64] = np.arange(64) % 15 + 0.5  # ties: with min 0 and max 15 the scale is exactly 1, w/s = x.5
    w[1, 0], w[1, 1] = 0.0, 15.0
    w[2, :64] = -w[1, :64]  # negative ties: std::round(-0.5) = -1, numpy's round(-0.5) = -0
    w[3, :64] = 0.25  # a constant group: the 1e-5 floor keeps the scale finite
    w[4, 64:] = np.linspace(0.1, 0.9, 64)  # min > 0: zero point clamps at 0
    w[5] = 0.0  # all-zero row (8-bit floor)
    return w


@pytest.mark.parametrize("group_size", [64, 32, 128])
def test_rtn4_bit_exact(group_size: int) -> None:
    w = rtn_weights()
    bias = np.linspace(-1, 1, w.shape[0]).astype(np.float32)
    ql = rtn_quantize(w, bits=4, group_size=group_size, bias=bias)
    q, scale, zp = rtn4_reference(w, group_size)
    assert ql.bits == 4 and ql.group_size == group_size and ql.g_idx is None
    np.testing.assert_array_equal(ql.q, q)
    np.testing.assert_array_equal(ql.scale.view(np.uint32), scale.view(np.uint32))
    np.testing.assert_array_equal(ql.zero, zp)
    np.testing.assert_array_equal(ql.bias, bias)
    if group_size == 64:  # the handcrafted ties landed where intended
        assert ql.scale[1, 0] == 1.0 and ql.q[1, 2] == 3  # 2.5 -> 3 (half-even would give 2)
        assert ql.zero[2, 0] == 15 and ql.q[2, 2] == 12  # -2.5 -> -3, + 15 (half-even: 13)


def test_fast_rounding_is_std_round_around_every_half_integer() -> None:
    """round_near_half_away_inplace against round_half_away on every float32 within 4096 ulps of each
    half-integer in [-17, 17] and of zero. Both are monotone step functions whose steps sit at the
    half-integers, so agreeing there (and at the ends of each window) they agree on all of [-17, 17]."""
    centres = np.concatenate([np.arange(0, 17, dtype=np.float32) + np.float32(0.5), np.float32([0.0])])
    bits = centres.view(np.int32)[:, None] + np.arange(-4096, 4097, dtype=np.int32)[None, :]
    x = bits[bits >= 0].view(np.float32)
    x = np.concatenate([x, -x, np.float32([17.0, -17.0])])
    expected = round_half_away(x)
    got = round_near_half_away_inplace(x.copy())
    np.testing.assert_array_equal(got, expected)
    # the float below one half is where adding 0.5 goes wrong: 0.49999997 + 0.5 rounds to 1
    below = np.nextafter(np.float32(0.5), np.float32(0))
    assert np.trunc(below + np.float32(0.5)) == 1 and round_near_half_away_inplace(np.float32([below]))[0] == 0


def test_rtn_default_group_and_per_channel() -> None:
    w = rtn_weights()
    assert rtn_quantize(w).group_size == 64
    per_channel = rtn_quantize(w, group_size=None)
    q, scale, _ = rtn4_reference(w, w.shape[1])
    np.testing.assert_array_equal(per_channel.q, q)
    np.testing.assert_array_equal(per_channel.scale, scale)


def test_rtn8_bit_exact() -> None:
    w = rtn_weights()
    ql = rtn_quantize(w, bits=8)
    q, scale = rtn8_reference(w)
    assert ql.group_size == w.shape[1] and ql.scale.shape == (w.shape[0], 1)
    np.testing.assert_array_equal(ql.q, q)
    np.testing.assert_array_equal(ql.scale.view(np.uint32), scale.view(np.uint32))
    np.testing.assert_array_equal(ql.zero, np.full((w.shape[0], 1), 128, np.float32))
    np.testing.assert_array_equal(ql.dequantize()[5], 0)
    back = unpack(pack(ql))
    np.testing.assert_array_equal(back.dequantize(), ql.dequantize())


def test_rtn_errors() -> None:
    w = np.zeros((2, 96), np.float32)
    with pytest.raises(LlmbuildError, match="group_size 64 does not divide in_features 96"):
        rtn_quantize(w)
    with pytest.raises(LlmbuildError, match="unsupported bits 3"):
        rtn_quantize(w, bits=3)


# --- bad checkpoints: one line naming the tensor or field ---------------------------------------------------


def one_layer_checkpoint(tmp_path: Path, fixture: str, edit=None, config_edit=None) -> Path:
    """A copy of one fixture layer (q_proj) as its own checkpoint, tensors optionally edited."""
    src = FIXTURES / fixture
    out = tmp_path / fixture
    out.mkdir()
    shutil.copyfile(src / "config.json", out / "config.json")
    prefix = "model.layers.0.self_attn.q_proj."
    with safe_open(str(src / "model.safetensors"), framework="np") as f:
        tensors = {n: f.get_tensor(n) for n in f.keys() if n.startswith(prefix)}  # noqa: SIM118
    if edit:
        edit(tensors)
    save_file(tensors, str(out / "model.safetensors"))
    if config_edit:
        config = json.loads((out / "config.json").read_text())
        config_edit(config["quantization_config"])
        (out / "config.json").write_text(json.dumps(config))
    return out


def read_error(directory: Path) -> str:
    ckpt = QuantizedCheckpoint(directory)
    with pytest.raises(LlmbuildError) as err:
        ckpt.linear("model.layers.0.self_attn.q_proj")
    message = str(err.value)
    assert "\n" not in message
    return message


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    path = one_layer_checkpoint(
        tmp_path, "gptq_asym_g32", edit=lambda t: t.pop("model.layers.0.self_attn.q_proj.qzeros")
    )
    assert "missing tensor 'model.layers.0.self_attn.q_proj.qzeros'" in read_error(path)


def test_missing_g_idx_with_act_order_is_named(tmp_path: Path) -> None:
    path = one_layer_checkpoint(
        tmp_path, "gptq_sym_actorder_g32", edit=lambda t: t.pop("model.layers.0.self_attn.q_proj.g_idx")
    )
    assert "missing tensor 'model.layers.0.self_attn.q_proj.g_idx'" in read_error(path)


def test_wrong_packed_shape_names_tensor_and_shapes(tmp_path: Path) -> None:
    def halve(t: dict[str, np.ndarray]) -> None:
        t["model.layers.0.self_attn.q_proj.qweight"] = t["model.layers.0.self_attn.q_proj.qweight"][:4]

    message = read_error(one_layer_checkpoint(tmp_path, "gptq_sym_g32", edit=halve))
    assert "tensor 'model.layers.0.self_attn.q_proj.qweight' has shape [4, 64], expected [8, 64]" in message
    assert "in_features 64" in message


def test_wrong_scale_shape_in_awq(tmp_path: Path) -> None:
    def drop_group(t: dict[str, np.ndarray]) -> None:
        t["model.layers.0.self_attn.q_proj.scales"] = t["model.layers.0.self_attn.q_proj.scales"][:1]

    message = read_error(one_layer_checkpoint(tmp_path, "awq_gemm_g32", edit=drop_group))
    assert "tensor 'model.layers.0.self_attn.q_proj.scales' has shape [1, 64], expected [2, 64]" in message


def test_group_size_not_dividing_k(tmp_path: Path) -> None:
    path = one_layer_checkpoint(tmp_path, "gptq_sym_g32", config_edit=lambda qc: qc.update(group_size=48))
    assert "group_size 48 does not divide in_features 64" in read_error(path)


@pytest.mark.parametrize(
    ("qc", "expected"),
    [
        ({"quant_method": "gptq", "bits": 3, "group_size": 32}, "quantization_config.bits: unsupported bits 3"),
        ({"quant_method": "awq", "bits": 4, "version": "gemm", "zero_point": True}, "missing field 'group_size'"),
        ({"quant_method": "awq", "bits": 8, "group_size": 32}, "unsupported bits 8 for AWQ"),
        ({"quant_method": "gptq", "group_size": 32}, "missing field 'bits'"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 32, "checkpoint_format": "marlin"}, "checkpoint_format"),
        ({"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemv"}, "version: unsupported"),
        ({"quant_method": "auto-round", "bits": 4, "group_size": 32, "packing_format": "auto_round:exl"},
         "packing_format: unsupported"),
        ({"quant_method": "bitsandbytes"}, "quant_method: unsupported 'bitsandbytes'"),
        ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {"weights": {
            "num_bits": 2, "strategy": "group", "group_size": 32}}}}, "num_bits: unsupported bits 2"),
    ],
)  # fmt: skip
def test_bad_configs(qc: dict, expected: str) -> None:
    with pytest.raises(LlmbuildError) as err:
        detect_quantization({"quantization_config": qc}, origin="ckpt/config.json")
    message = str(err.value)
    assert message.startswith("ckpt/config.json: quantization_config") and "\n" not in message
    assert expected in message


def test_awq_without_group_size_fixture(tmp_path: Path) -> None:
    with pytest.raises(LlmbuildError, match=r"quantization_config: missing field 'group_size'"):
        QuantizedCheckpoint(one_layer_checkpoint(tmp_path, "awq_gemm_g32", config_edit=lambda qc: qc.pop("group_size")))


def test_not_quantized() -> None:
    with pytest.raises(LlmbuildError, match="missing field 'quantization_config'"):
        detect_quantization({"model_type": "llama"})


def test_quantized_linear_validates_shapes() -> None:
    with pytest.raises(LlmbuildError, match=r"scale has shape \[2, 3\], expected \[2, 2\]"):
        QuantizedLinear(q=np.zeros((2, 64), np.uint8), scale=np.ones((2, 3), np.float32),
                        zero=np.zeros((2, 2), np.float32), group_size=32, bits=4)  # fmt: skip


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("order", [None, "awq"])
def test_unpacking_along_columns_gives_each_word_s_fields_in_order(bits: int, order: str | None) -> None:
    """Every field of every word, at column c * pf + order[p], negative words included (the 4-bit path
    reads the words' bytes instead of shifting them: the same fields)."""
    from llmbuild.quant.readers import AWQ_ORDER, unpack_along_cols

    pf = 32 // bits
    perm = None if order is None else (AWQ_ORDER if bits == 4 else tuple(reversed(range(pf))))
    words = np.random.default_rng(bits).integers(-(2**31), 2**31, size=(5, 7), dtype=np.int64).astype(np.int32)
    got = unpack_along_cols(words, bits, perm)
    as_u32 = words.view(np.uint32).astype(np.uint64)
    for p in range(pf):
        column = p if perm is None else perm[p]
        want = (as_u32 >> np.uint64(p * bits)) & np.uint64((1 << bits) - 1)
        np.testing.assert_array_equal(got[:, column::pf], want.astype(np.uint8))

"""The TopOp -> vendor top-dialect exporter (llmbuild/bmodel/top_export.py), without the vendor's tools: the
contract LLM-TPU's runtime reads (names, input order, layouts), the attribute values pinned against the
vendor's defaults, the quantized and history forms, and the one-line errors."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from llmbuild import LlmbuildError
from llmbuild.bmodel import vendor_ir
from llmbuild.bmodel.top_export import DynamicPrefill, ExportError, FinalNorm, export_net
from llmbuild.families.spec import ModelSpec
from llmbuild.importer.nets import build_block, head_nets
from llmbuild.importer.rope import rope_tables
from llmbuild.importer.shapes import Shapes
from llmbuild.quant.pack import pack_levels
from llmbuild.quant.scheme import QuantScheme

SPEC = ModelSpec("qwen2", 64, 2, 4, 2, 16, 128, 512, 1e-6, 10000.0, True, True, False, 256)
SHAPES = Shapes(64, 16)


def weights_for(module, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random weights for every `top.Weight` the net names, with the dtype and shape it declares."""
    out = {}
    for op in module.walk():
        if op.name == "top.Weight":
            name = op.attributes["name"].data
            shape = tuple(op.results[0].type.get_shape())
            if name.endswith(".qweight"):
                out[name] = rng.integers(0, 16, shape).astype(np.uint8)
            elif name.endswith(".zeros"):
                out[name] = rng.integers(0, 16, shape).astype(np.float32)
            elif name.endswith(".perm"):
                out[name] = rng.permutation(shape[0]).astype(np.int32)
            else:
                out[name] = rng.standard_normal(shape).astype(np.float32)
    cos, sin = rope_tables(SPEC, SHAPES.seq_length)
    out["rope.cos"], out["rope.sin"] = cos, sin
    return out


def export(layer: int, stage: str, quant=None, final=False, dynamic=None):
    module = build_block(SPEC, layer, stage, SHAPES, quant)
    weights = weights_for(module, np.random.default_rng(0))
    norm = FinalNorm(np.ones(SPEC.hidden_size, np.float32), SPEC.rms_norm_eps) if final else None
    return export_net(module, weights, "w.npz", norm, dynamic), weights


def locs(text: str) -> list[str]:
    return re.findall(r'loc\("([^"]+)"\)', text)


def test_prefill_block_has_the_runtime_contract():
    net, weights = export(0, "prefill")
    text = net.text()
    # inputs in LLM-TPU's order and names; integer inputs are si32 arguments whose top.Input is f32
    assert [a[0] for a in net.args] == ["input_states", "position_ids", "attention_mask"]
    assert "%arg1: tensor<1x16xsi32>" in text and "(tensor<1x16xsi32>) -> tensor<1x16xf32>" in text
    # outputs named by the ops that compute them: output_states, k_cache (roped k), v_cache
    returned = re.search(r"return (.*) :", text).group(1).split(", ")
    named = {m.group(1): m.group(2) for m in re.finditer(r"(%\d+) = .* loc\(\"([^\"]+)\"\)", text)}
    assert [named[v] for v in returned] == ["output_states", "k_cache", "v_cache"]
    # layouts: linear weights [K, N] (TopOp's [N, K] transposed), norms and biases with leading ones,
    # RoPE tables [S, 1, d]
    w = net.weights
    q = weights["layers.0.self_attn.q_proj.weight"]
    np.testing.assert_array_equal(w["model.layers.0.self_attn.q_proj.weight"], q.T)
    assert w["model.layers.0.input_layernorm.weight"].shape == (1, 1, 64)
    assert w["model.layers.0.self_attn.k_proj.bias"].shape == (1, 1, 32)
    assert w["rotary_cos.weight"].shape == (64, 1, 16)
    np.testing.assert_array_equal(w["rotary_sin.weight"][:, 0], weights["rope.sin"])
    # weight keys are the HF names the incumbent uses, in the incumbent's order
    keys = [k for k in locs(text) if k in w]
    assert keys == list(w)
    assert keys[:3] == ["model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.bias",
                        "model.layers.0.self_attn.q_proj.weight"]


def test_pinned_attributes_are_written_explicitly():
    """Defaults of the vendor's op definitions that change the result are never left to chance."""
    text = export(0, "prefill")[0].text()
    assert text.count('rope_mode = "contiguous_halves"') == 2  # the default, interleaved_pairs, is wrong
    assert "keep_dims = false" in text.split('"top.FAttention"')[1].split("\n")[0]  # the default, true
    assert "mask_size = 0 : si32" in text
    rope = [line for line in text.splitlines() if '"top.Rope"' in line][0]
    # the vendor's Rope takes (x, sin, cos)
    operands = re.search(r'"top.Rope"\((%\d+), (%\d+), (%\d+)\)', rope).groups()
    named = {m.group(1): m.group(2) for m in re.finditer(r"(%\d+) = .* loc\(\"([^\"]+)\"\)", text)}
    assert [named[o] for o in operands[1:]] == ["rotary_sin", "rotary_cos"]
    assert vendor_ir.ROPE["rope_mode"] == '"contiguous_halves"' and vendor_ir.FATTENTION["keep_dims"] == "false"


def test_last_block_applies_the_final_norm_and_lm_head_ends_in_top1():
    net, _ = export(1, "decode", final=True)
    text = net.text()
    assert "model.norm.weight" in net.weights
    assert re.search(r'"top.RMSNorm".* loc\("output_states"\)', text)
    assert 'loc("model.layers.1.mlp.down_proj.add")' in text
    head = head_nets(SPEC, SHAPES)
    table = np.random.default_rng(1).standard_normal((512, 64)).astype(np.float32)
    lm = export_net(head["lm_head"], {"embed_tokens.weight": table, "norm.weight": np.ones(64, np.float32)},
                    "w.npz").text()
    assert "RMSNorm" not in lm  # moved into the last block
    assert '"top.TopK"' in lm and 'loc(fused["token_value", "token_id"])' in lm
    assert "right_transpose = true" in lm and "tensor<512x1xf32>" in lm


def test_quantized_projections_are_a16matmul_over_the_given_levels():
    quant = QuantScheme(bits=4, group_size=32, act_dtype="bf16", act_order=True)
    net, weights = export(0, "decode", quant=quant)
    text = net.text()
    assert text.count('"top.A16MatMul"') == 7
    levels = weights["layers.0.mlp.up_proj.qweight"]
    packed = net.weights["model.layers.0.mlp.up_proj.qweight"]
    assert packed.dtype == np.uint8 and packed.shape == (128, 32)
    np.testing.assert_array_equal(packed & 0x0F, levels[:, 0::2])  # even k in the low nibble
    np.testing.assert_array_equal(packed >> 4, levels[:, 1::2])
    assert net.weights["model.layers.0.mlp.up_proj.qzeros"].dtype == np.uint8
    assert "q_group_size = 32 : i64" in text and "weight_bits = 4 : i64" in text
    # act order: the input permuted by a Gather over the levels' order, not ignored
    assert 'loc("model.layers.0.mlp.up_proj.act_order")' in text


def test_zero_points_the_vendor_cannot_take_fail_naming_the_net():
    quant = QuantScheme(bits=4, group_size=32, act_dtype="bf16")
    module = build_block(SPEC, 0, "decode", SHAPES, quant)
    weights = weights_for(module, np.random.default_rng(0))
    weights["layers.0.self_attn.q_proj.zeros"] = weights["layers.0.self_attn.q_proj.zeros"] + 0.5
    with pytest.raises(ExportError, match=r"^net block_cache_0: layers.0.self_attn.q_proj: zero points"):
        export_net(module, weights, "w.npz")


def test_history_form_has_no_mask_input_and_one_weight_layout():
    dyn = DynamicPrefill(256)
    prefill = export(0, "prefill", dynamic=dyn)[0]
    kv = export(0, "prefill_kv", dynamic=dyn)[0]
    decode = export(0, "decode", dynamic=dyn)[0]
    assert [a[0] for a in prefill.args] == ["input_states", "position_ids"]
    assert [a[0] for a in kv.args] == ["input_states", "position_ids", "history_k", "history_v"]
    assert [a[0] for a in decode.args][2] == "attention_mask"  # decode keeps its mask input
    mask = prefill.weights["attention_mask.weight"]
    assert mask.shape == (256, 256) and mask[0, 1] == -1e9 and mask[1, 0] == 0 and mask[5, 5] == 0
    assert "mask_size = 256 : si32" in prefill.text()
    assert '{placeholder = "F32"}' in decode.text()
    # the three nets declare the same weights in the same order (they share one copy on the device)
    order = [[k for k in locs(n.text()) if k in n.weights] for n in (prefill, kv, decode)]
    assert order[0] == order[1] == order[2]


def test_pack_levels_rejects_what_it_cannot_pack():
    with pytest.raises(LlmbuildError):
        pack_levels(np.zeros((2, 3), np.uint8), 4, "test")
    np.testing.assert_array_equal(pack_levels(np.array([[1, 2, 15, 0]], np.uint8), 4, "test"), [[0x21, 0x0F]])


def test_f64_attributes_round_trip_and_refuse_nan():
    assert vendor_ir.f64(1e-06) == "1.0e-06 : f64"
    assert float(vendor_ir.f64(0.125).split()[0]) == 0.125
    with pytest.raises(ValueError):
        vendor_ir.f64(float("nan"))


@pytest.mark.skipif(shutil.which("mlir-opt-22") is None, reason="mlir-opt-22 (Debian mlir-22-tools) not installed")
def test_exported_modules_parse_with_upstream_mlir(tmp_path):
    for stage in ("prefill", "decode"):
        path = tmp_path / f"{stage}.mlir"
        path.write_text(export(1, stage, final=True, dynamic=DynamicPrefill(128))[0].text())
        done = subprocess.run(["mlir-opt-22", "--allow-unregistered-dialect", str(path)], capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr

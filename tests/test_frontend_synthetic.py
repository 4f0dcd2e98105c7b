"""Synthetic checkpoints: transformers loads them, HFSource reads the same tensors, the output is
byte-identical across processes, a tiny random model decodes non-degenerately, and writes are atomic."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llmbuild import LlmbuildError
from llmbuild.families.registry import FAMILIES, family_for_hf_model_type, get_family
from llmbuild.frontend.hf import HFSource
from llmbuild.frontend.sources import open_source, prepare_checkpoint
from llmbuild.frontend.synthetic import SPECIAL_TOKENS, make_synthetic_checkpoint
from llmbuild.frontend.tokenizer_files import read_tokenizer_bundle
from llmbuild.recipe_types import SourceConfig

os.environ["HF_HUB_OFFLINE"] = "1"

_BASE = {
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "rope_theta": 10000,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 256,
}
# The recipes' tiny configs: qwen2 with bias and tied embeddings, llama untied, qwen3 with q/k norm.
TINY = {
    "qwen2": _BASE | {"model_type": "qwen2", "tie_word_embeddings": True},
    "llama": _BASE | {"model_type": "llama", "tie_word_embeddings": False},
    "qwen3": _BASE | {"model_type": "qwen3", "tie_word_embeddings": True, "head_dim": 16},
}


def _source(arch: str, seed: int = 0) -> SourceConfig:
    return SourceConfig(kind="synthetic", config=TINY[arch], seed=seed)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("synthetic")
    dirs = {}
    for arch in TINY:
        dirs[arch] = root / arch
        prepare_checkpoint(_source(arch), dirs[arch])
    return dirs


@pytest.fixture(scope="module")
def references(checkpoints: dict[str, Path]) -> dict[str, tuple]:
    pytest.importorskip("transformers")
    from llmbuild.verify.hf_reference import load_reference_model

    return {arch: load_reference_model(_source(arch), path) for arch, path in checkpoints.items()}


def test_registry_is_sorted_and_lazy() -> None:
    assert list(FAMILIES) == sorted(FAMILIES)
    assert family_for_hf_model_type("qwen2") == "qwen2"
    assert get_family("llama").name == "llama"
    with pytest.raises(LlmbuildError, match="expected one of llama, qwen2, qwen3"):
        get_family("gpt2")
    with pytest.raises(LlmbuildError, match="unsupported model_type 'mistral'"):
        family_for_hf_model_type("mistral")


@pytest.mark.parametrize("arch", sorted(TINY))
def test_spec_from_synthetic_config(checkpoints: dict[str, Path], arch: str) -> None:
    spec = open_source(_source(arch), checkpoints[arch]).spec
    assert spec.architecture == arch
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads) == (64, 4, 4, 2)
    assert (spec.head_dim, spec.intermediate_size, spec.vocab_size) == (16, 128, 512)
    assert spec.qkv_bias == (arch == "qwen2")
    assert spec.qk_norm == (arch == "qwen3")
    assert spec.tie_word_embeddings == (arch != "llama")
    assert spec.eos_token_ids == (SPECIAL_TOKENS.index("<|im_end|>"),)
    assert spec.rope_scaling == () and spec.rope_theta == 10000.0


@pytest.mark.parametrize("arch", sorted(TINY))
def test_transformers_state_dict_equals_hf_source(
    checkpoints: dict[str, Path], references: dict[str, tuple], arch: str
) -> None:
    model, _ = references[arch]
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    source = HFSource(checkpoints[arch])
    names = source.names()
    hf_names = {n if n.startswith("lm_head.") else "model." + n for n in names}
    # Every transformers parameter is a canonical tensor (tied lm_head aside), and vice versa.
    expected = set(state) - ({"lm_head.weight"} if source.spec.tie_word_embeddings else set())
    assert hf_names == expected
    for name in names:
        ours = source.tensor(name)
        assert ours.dtype == np.float32
        np.testing.assert_array_equal(ours, state[name if name.startswith("lm_head.") else "model." + name])


@pytest.mark.parametrize("arch", sorted(TINY))
def test_random_model_decodes_non_degenerately(references: dict[str, tuple], arch: str) -> None:
    import torch

    model, tokenizer = references[arch]
    messages = [{"role": "user", "content": "Tell me about the lighthouse keeper."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    prompt = ids["input_ids"]
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
        logits = model(out).logits[0, prompt.shape[1] - 1 :]
    new = out[0, prompt.shape[1] :].tolist()
    longest_run = max(len(list(run)) for _, run in itertools.groupby(new))
    assert len(set(new)) >= 8 and longest_run <= 4, new
    assert logits.std(dim=-1).min().item() > 3.0  # logits spread by several units
    top2 = logits.topk(2).values
    assert (top2[:, 0] - top2[:, 1]).min().item() > 1e-4  # no near-ties float32 rounding could flip


def test_tokenizer_is_trained_bpe_with_chat_template(checkpoints: dict[str, Path], references: dict) -> None:
    from tokenizers import Tokenizer

    _, reference = references["qwen2"]
    ours = Tokenizer.from_file(str(checkpoints["qwen2"] / "tokenizer.json"))
    assert ours.get_vocab_size(with_added_tokens=True) == 512 == len(reference)
    for i, token in enumerate(SPECIAL_TOKENS):
        assert ours.token_to_id(token) == i
    chat = reference.apply_chat_template([{"role": "user", "content": "Hi there!"}], tokenize=False)
    assert chat == "<|im_start|>user\nHi there!<|im_end|>\n"
    for text in ("The lighthouse stood on a low shelf of granite.", "naïve café 你好 🤖", chat, ""):
        assert ours.encode(text).ids == reference(text)["input_ids"]
        assert ours.decode(ours.encode(text).ids, skip_special_tokens=False) == text
    # Words of the corpus are single tokens: the BPE really was trained on it.
    assert len(ours.encode(" the").ids) == 1
    bundle = read_tokenizer_bundle(checkpoints["qwen2"])
    assert bundle.eos_token_ids == (2,) and bundle.eos_token == "<|im_end|>" and bundle.bos_token_id == 0
    assert bundle.chat_template and "<|im_start|>" in bundle.chat_template


_BUILD = """
import sys
from pathlib import Path
from llmbuild.frontend.synthetic import make_synthetic_checkpoint
make_synthetic_checkpoint({config!r}, 7, Path(sys.argv[1]))
"""


def test_byte_identical_across_processes(tmp_path: Path) -> None:
    code = _BUILD.format(config=TINY["qwen3"])
    env = {k: v for k, v in os.environ.items() if k != "TOKENIZERS_PARALLELISM"}
    runs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path / name)], env=env | {"PYTHONHASHSEED": seed})
        for name, seed in (("a", "1"), ("b", "2"))
    ]
    assert [p.wait(timeout=120) for p in runs] == [0, 0]
    make_synthetic_checkpoint(TINY["qwen3"], 7, tmp_path / "c")
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    for other in ("b", "c"):
        assert sorted(p.name for p in (tmp_path / other).iterdir()) == files
        for name in files:
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / other / name).read_bytes(), name
    # ...and the seed matters.
    make_synthetic_checkpoint(TINY["qwen3"], 8, tmp_path / "d")
    assert (tmp_path / "a/model.safetensors").read_bytes() != (tmp_path / "d/model.safetensors").read_bytes()


def test_failed_build_leaves_nothing_and_rebuild_replaces(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "ckpt"
    with pytest.raises(LlmbuildError, match="missing field 'vocab_size'"):
        make_synthetic_checkpoint({k: v for k, v in TINY["llama"].items() if k != "vocab_size"}, 0, out)
    with pytest.raises(LlmbuildError, match="hidden_act 'gelu' is not supported"):
        make_synthetic_checkpoint(TINY["llama"] | {"hidden_act": "gelu"}, 0, out)

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    # A failure halfway through writing (config.json already written) leaves no trace either.
    with monkeypatch.context() as m:
        m.setattr("safetensors.numpy.save_file", disk_full)
        with pytest.raises(OSError):
            make_synthetic_checkpoint(TINY["llama"], 0, out)
    assert list(tmp_path.iterdir()) == []
    make_synthetic_checkpoint(TINY["llama"], 0, out)
    (out / "stale.txt").write_text("left over from an older build")
    make_synthetic_checkpoint(TINY["llama"], 1, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert not (out / "stale.txt").exists()

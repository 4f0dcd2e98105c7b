"""HFSource on hand-made variants of a synthetic checkpoint: sharded and bf16 safetensors, and the
errors a broken directory must give (one line, naming the file and tensor)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from llmbuild import LlmbuildError
from llmbuild.families.registry import get_family
from llmbuild.frontend.hf import HFSource
from llmbuild.frontend.sources import open_source, prepare_checkpoint
from llmbuild.frontend.synthetic import make_synthetic_checkpoint
from llmbuild.frontend.tokenizer_files import read_tokenizer_bundle
from llmbuild.recipe_types import SourceConfig

CONFIG = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "tie_word_embeddings": True,
    "max_position_embeddings": 256,
}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hf") / "base"
    make_synthetic_checkpoint(CONFIG, 3, path)
    return path


def _variant(base: Path, tmp_path: Path, tensors: dict[str, np.ndarray] | None = None) -> Path:
    """A copy of `base` without its weights; `tensors`, if given, become its model.safetensors."""
    out = tmp_path / "variant"
    shutil.copytree(base, out, ignore=shutil.ignore_patterns("model.safetensors"))
    if tensors is not None:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _one_line_error(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_sharded_matches_single(base: Path, tmp_path: Path) -> None:
    tensors = load_file(str(base / "model.safetensors"))
    out = _variant(base, tmp_path)
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for shard, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, str(out / shard), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(shard_names, shard)
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    single, sharded = HFSource(base), HFSource(out)
    assert sharded.spec == single.spec
    assert sharded.names() == single.names() and len(single.names()) == 1 + 2 * 12 + 1
    for name in single.names():
        np.testing.assert_array_equal(sharded.tensor(name), single.tensor(name))


def test_bf16_and_f16_read_as_float32(base: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as save_torch

    tensors = load_file(str(base / "model.safetensors"))
    out = _variant(base, tmp_path)
    half = {
        n: torch.from_numpy(v).to(torch.bfloat16 if i % 2 else torch.float16)
        for i, (n, v) in enumerate(tensors.items())
    }
    save_torch(half, str(out / "model.safetensors"), metadata={"format": "pt"})
    source = HFSource(out)
    for name in source.names():
        hf_name = "model." + name
        ours = source.tensor(name)
        assert ours.dtype == np.float32 and ours.shape == tensors[hf_name].shape
        np.testing.assert_array_equal(ours, half[hf_name].float().numpy())  # widening is exact
        assert np.abs(ours - tensors[hf_name]).max() <= 1e-2 * np.abs(tensors[hf_name]).max()


def test_missing_tensor_names_file_and_tensor(base: Path, tmp_path: Path) -> None:
    tensors = load_file(str(base / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    source = HFSource(_variant(base, tmp_path, tensors))
    assert "layers.1.self_attn.k_proj.bias" not in source.names()
    with pytest.raises(LlmbuildError) as excinfo:
        source.tensor("layers.1.self_attn.k_proj.bias")
    message = _one_line_error(excinfo)
    assert "model.safetensors" in message and "'model.layers.1.self_attn.k_proj.bias'" in message


def test_bad_shape_names_tensor_and_expected_shape(base: Path, tmp_path: Path) -> None:
    tensors = load_file(str(base / "model.safetensors"))
    tensors["model.layers.0.mlp.up_proj.weight"] = np.zeros((64, 128), dtype=np.float32)  # transposed
    source = HFSource(_variant(base, tmp_path, tensors))
    with pytest.raises(LlmbuildError) as excinfo:
        source.tensor("layers.0.mlp.up_proj.weight")
    message = _one_line_error(excinfo)
    assert "'model.layers.0.mlp.up_proj.weight'" in message
    assert "[64, 128]" in message and "expected [128, 64]" in message
    with pytest.raises(LlmbuildError, match="not a tensor of this qwen2 model"):
        source.tensor("lm_head.weight")  # tied: the head is the embedding


def test_missing_config_or_weights(base: Path, tmp_path: Path) -> None:
    out = _variant(base, tmp_path)
    with pytest.raises(LlmbuildError, match="no model.safetensors or model.safetensors.index.json"):
        HFSource(out)
    (out / "config.json").unlink()
    with pytest.raises(LlmbuildError) as excinfo:
        HFSource(out)
    assert "config.json: missing" in _one_line_error(excinfo)
    with pytest.raises(LlmbuildError, match="no config.json"):
        prepare_checkpoint(SourceConfig(kind="hf", path=str(out)), tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


def test_prepare_hf_writes_only_a_pointer(base: Path, tmp_path: Path) -> None:
    source = SourceConfig(kind="hf", path=str(base))
    ckpt = tmp_path / "ckpt"
    prepare_checkpoint(source, ckpt)
    assert [p.name for p in ckpt.iterdir()] == ["source.json"]
    assert json.loads((ckpt / "source.json").read_text()) == {"kind": "hf", "path": str(base.resolve())}
    assert open_source(source, ckpt).spec == HFSource(base).spec
    bundle = read_tokenizer_bundle(ckpt)  # follows the pointer to the HF directory
    assert bundle.tokenizer_json == (base / "tokenizer.json").read_text()


def test_spec_from_hf_config_variants() -> None:
    llama, qwen3 = get_family("llama"), get_family("qwen3")
    cfg = {k: v for k, v in CONFIG.items() if k != "model_type"}
    spec = llama.spec_from_hf_config(
        cfg
        | {
            "eos_token_id": [2, 7],
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "extra": [1, 2]},
        }
    )
    assert spec.eos_token_ids == (2, 7) and spec.bos_token_id == 1  # LlamaConfig's default bos
    assert spec.rope_scaling == (("extra", (1, 2)), ("factor", 8.0), ("rope_type", "llama3"))
    hash(spec)  # a ModelSpec must stay hashable
    # transformers 5 writes rope_parameters; plain RoPE flattens to ().
    spec = llama.spec_from_hf_config(cfg | {"rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}})
    assert spec.rope_theta == 5e5 and spec.rope_scaling == () and spec.eos_token_ids == (2,)
    # Qwen3Config's head_dim is 128 when config.json leaves it out; transformers builds that model.
    assert qwen3.spec_from_hf_config(cfg).head_dim == 128
    assert qwen3.spec_from_hf_config(cfg | {"head_dim": 32}).head_dim == 32
    with pytest.raises(LlmbuildError, match="attention_bias=true is not supported for llama"):
        llama.spec_from_hf_config(cfg | {"attention_bias": True})
    with pytest.raises(LlmbuildError, match="config.json: missing field 'intermediate_size'"):
        llama.spec_from_hf_config({k: v for k, v in cfg.items() if k != "intermediate_size"})

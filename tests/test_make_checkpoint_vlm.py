"""benchmarks/make_checkpoint.py's InternVL3-2B stand-in, truncated (one text layer at small widths, a 1024-token
vocabulary, a two-layer tower of width 64): transformers loads the native layout, both layouts hold the same
tensors, the image tokens sit at their published ids, and runs are byte-identical."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from test_make_checkpoint import VOCAB, mc

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
os.environ["HF_HUB_OFFLINE"] = "1"

TEXT = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2}
TOWER = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}


def _make(root: Path, layout: str) -> Path:
    path, _ = mc.make_checkpoint("internvl3_2b", root, layers=1, vocab_size=VOCAB, overrides=TEXT,
                                 vision_layout=layout, vision_overrides=TOWER)
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("vlm")
    return _make(root, "native"), _make(root, "internvl_chat")


def test_the_native_layout_loads_in_transformers_with_the_same_tensors_as_the_chat_one(made) -> None:
    from llmbuild.families.internvl.model import TensorView, load_config

    native, chat = made
    assert (native.name, chat.name) == ("InternVL3-2B-hf", "InternVL3-2B")
    model = transformers.InternVLForConditionalGeneration.from_pretrained(native)
    state = model.state_dict()
    ours, theirs = TensorView(native), TensorView(chat)
    assert not ours.chat and theirs.chat and set(ours.parts) == set(theirs.parts)
    assert set(state) - {"lm_head.weight"} == set(ours.parts)  # tied: lm_head is the embedding
    for name in ours.parts:
        assert torch.equal(state[name].float(), ours.get(name)) and torch.equal(ours.get(name), theirs.get(name))
    assert state["model.vision_tower.embeddings.position_embeddings"].shape == (1, 1025, 64)  # 448 px, patch 14
    assert load_config(chat).image_token_id == model.config.image_token_id == VOCAB - 151936 + 151667
    stored = json.loads((chat / "config.json").read_text())
    assert stored["model_type"] == "internvl_chat" and "llm_config" in stored
    fused = theirs.parts["model.vision_tower.encoder.layer.1.attention.v_proj.weight"]
    assert (fused.stored, fused.part, fused.parts) == ("vision_model.encoder.layers.1.attn.qkv.weight", 2, 3)


def test_tokens_and_template(made) -> None:
    native, _ = made
    tokenizer = transformers.AutoTokenizer.from_pretrained(native)
    base = VOCAB - 151936  # the published ids moved down with the vocabulary
    for token, published in (("<img>", 151665), ("</img>", 151666), ("<IMG_CONTEXT>", 151667), ("<|im_end|>", 151645)):
        assert tokenizer.convert_tokens_to_ids(token) == published + base
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Describe the image."}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == "<|im_start|>user\nDescribe the image.<|im_end|>\n<|im_start|>assistant\n"


def test_runs_are_byte_identical(made, tmp_path: Path) -> None:
    def digests(directory: Path) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}

    assert digests(_make(tmp_path, "internvl_chat")) == digests(made[1])


def _make_3_5(root: Path, layout: str) -> Path:
    text = TEXT | {"head_dim": 64}  # Qwen3's head_dim stays apart from hidden / heads (32)
    path, _ = mc.make_checkpoint("internvl3_5_2b", root, layers=1, vocab_size=VOCAB, overrides=text,
                                 vision_layout=layout, vision_overrides=TOWER)
    return path


@pytest.fixture(scope="module")
def made_3_5(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("vlm35")
    return _make_3_5(root, "native"), _make_3_5(root, "internvl_chat")


def test_internvl3_5_loads_in_transformers_from_either_layout(made_3_5, tmp_path: Path) -> None:
    """InternVL3.5-2B's stand-in (Qwen3 language model): the native layout loads in transformers' InternVL with
    no missing or unexpected key; the internvl_chat one, read by config.py and TensorView as the native one,
    fills the same model exactly; both layouts hold the same bytes; a second run writes the same files."""
    from llmbuild.families.internvl.model import TensorView, load_config

    native, chat = made_3_5
    assert (native.name, chat.name) == ("InternVL3_5-2B-HF", "InternVL3_5-2B")
    model, info = transformers.InternVLForConditionalGeneration.from_pretrained(native, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    text = model.config.text_config
    assert (text.model_type, text.head_dim, model.config.tie_word_embeddings) == ("qwen3", 64, False)
    assert model.model.language_model.layers[0].self_attn.q_norm.weight.shape == (64,)
    stored = json.loads((chat / "config.json").read_text())
    assert stored["model_type"] == "internvl_chat" and stored["llm_config"]["architectures"] == ["Qwen3ForCausalLM"]
    config = load_config(chat)  # the chat config read as the native one
    assert config.text_config.model_type == "qwen3" and config.vision_config.attention_bias
    assert config.image_token_id == model.config.image_token_id == VOCAB - 151936 + 151671
    with torch.device("meta"):
        rebuilt = transformers.InternVLForConditionalGeneration(config)
    view = TensorView(chat)
    missing, unexpected = rebuilt.load_state_dict({name: view.get(name) for name in view.parts}, strict=False,
                                                  assign=True)
    assert not missing and not unexpected
    state = model.state_dict()
    for name in view.parts:
        assert torch.equal(state[name].float(), view.get(name)), name
    tokenizer = transformers.AutoTokenizer.from_pretrained(native)
    base = VOCAB - 151936
    for token, published in (("</think>", 151668), ("<img>", 151669), ("<IMG_CONTEXT>", 151671)):
        assert tokenizer.convert_tokens_to_ids(token) == published + base

    def digests(directory: Path) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}

    assert digests(_make_3_5(tmp_path, "internvl_chat")) == digests(chat)

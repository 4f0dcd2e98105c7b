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

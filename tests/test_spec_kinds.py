"""ModelSpec's room for what differs between families (mlp, attention, per-layer state): a dense model's
JSON form is what it always was, a non-default kind round-trips, and the shared block builder refuses a
kind it does not compile with one line that names it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from llmbuild import LlmbuildError
from llmbuild.artifacts.paths import read_spec, write_spec
from llmbuild.cost.chip_estimate import spec_from_dict
from llmbuild.families.registry import get_family
from llmbuild.families.spec import spec_to_json
from llmbuild.importer.nets import build_block
from llmbuild.importer.shapes import Shapes

CONFIG = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 256}
# The fields spec.json has always had, in its sorted order: a dense model's file must keep exactly these.
DENSE_FIELDS = ["architecture", "bos_token_id", "eos_token_ids", "head_dim", "hidden_size", "intermediate_size",
                "max_position_embeddings", "num_heads", "num_kv_heads", "num_layers", "qk_norm", "qkv_bias",
                "rms_norm_eps", "rope_scaling", "rope_theta", "tie_word_embeddings", "vocab_size"]


def dense():
    return get_family("qwen2").spec_from_hf_config(CONFIG)


def test_a_dense_spec_json_has_only_the_fields_it_always_had(tmp_path: Path) -> None:
    write_spec(dense(), tmp_path / "spec.json")
    assert sorted(json.loads((tmp_path / "spec.json").read_text())) == DENSE_FIELDS
    assert read_spec(tmp_path / "spec.json") == dense()


def test_a_non_default_kind_round_trips_through_json(tmp_path: Path) -> None:
    spec = replace(dense(), mlp="moe", attention="linear", layer_state=(("conv_state", (4, 64)),))
    data = spec_to_json(spec)
    assert (data["mlp"], data["attention"]) == ("moe", "linear")
    write_spec(spec, tmp_path / "spec.json")
    assert read_spec(tmp_path / "spec.json") == spec
    assert spec_from_dict(json.loads(json.dumps(data))) == spec


@pytest.mark.parametrize(("change", "message"), [
    ({"mlp": "moe"}, "qwen2: mlp 'moe' is not compiled (compiled: dense)"),
    ({"attention": "sliding"}, "qwen2: attention 'sliding' is not compiled (compiled: full)"),
    ({"layer_state": (("ssm_state", (16, 64)),)},
     "qwen2: per-layer state (ssm_state) besides the KV cache is not compiled"),
])
def test_the_block_builder_refuses_a_kind_it_does_not_compile(change: dict, message: str) -> None:
    with pytest.raises(LlmbuildError) as info:
        build_block(replace(dense(), **change), 0, "prefill", Shapes(32, 8))
    assert str(info.value) == message

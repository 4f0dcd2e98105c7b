"""A family's folder is all a new family needs: tests/families/toy_family/ (a block with post-branch norms
that the shared builder makes only through the family's hook), registered here through the registry's
public function, built end to end by the library path a recipe's steps take (prepare, plan, layers, head,
link), run by the runtime, and checked against a float64 numpy reference of the toy architecture."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from families.toy_family import reference
from families.toy_family.family import NAME, OUTPUT_NORMS

from llmbuild import LlmbuildError
from llmbuild.families.registry import get_family, register_family, unregister_family

CONFIG = {
    "model_type": NAME,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "vocab_size": 320,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1.0e-6,
    "tie_word_embeddings": False,
    "max_position_embeddings": 256,
}
RECIPE = f"""\
description: the test-only sandwich-norm family, built end to end
architecture: {NAME}
source:
  kind: synthetic
  seed: 3
  config: {json.dumps(CONFIG)}
quantization:
  mode: f32
target:
  chip: bm1684x
stages:
  seq_length: 32
  prefill_length: 8
bmodel:
  build: false
"""
PROMPT = [1, 5, 9, 42, 7]
STEPS = 6


@pytest.fixture
def toy_family() -> Iterator[str]:
    register_family(NAME, "families.toy_family.family")
    try:
        yield NAME
    finally:
        unregister_family(NAME)


def test_registering_the_same_name_for_another_module_is_refused(toy_family: str) -> None:
    with pytest.raises(LlmbuildError, match="already registered"):
        register_family(toy_family, "llmbuild.families.llama.family")
    register_family(toy_family, "families.toy_family.family")  # the same module again is no change


def test_an_unregistered_family_is_unknown_by_the_registry_s_message() -> None:
    with pytest.raises(LlmbuildError, match=f"unknown architecture '{NAME}': expected one of llama, qwen2"):
        get_family(NAME)


def test_toy_family_builds_end_to_end_and_matches_its_float64_reference(
        toy_family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.numpy import load_file

    from llmbuild.artifacts.paths import BuildPaths, read_spec
    from llmbuild.families.layout import layer_tensor_names
    from llmbuild.recipe import load_recipe
    from llmbuild.runtime.compiled_model import CompiledModel
    from llmbuild.steps.head import build_head
    from llmbuild.steps.layer import build_layer
    from llmbuild.steps.link import link
    from llmbuild.steps.plan import plan
    from llmbuild.steps.prepare import prepare

    monkeypatch.setenv("LLMBUILD_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("LLMBUILD_BMODEL", "0")
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "toy_sandwich_tiny.yaml").write_text(RECIPE)
    recipe = load_recipe(recipes / "toy_sandwich_tiny.yaml")

    prepare(recipe)
    paths = BuildPaths.of(recipe)
    spec = read_spec(paths.spec)
    assert spec.architecture == NAME
    assert {f"layers.1.{name}" for name in OUTPUT_NORMS.values()} <= set(layer_tensor_names(spec, 1))
    plan(recipe)
    for layer in range(spec.num_layers):
        build_layer(recipe, layer)
    build_head(recipe)
    link(recipe)

    ids, logits = CompiledModel(paths.binary(recipe.name)).generate(PROMPT, STEPS)

    tensors = {k: v.astype(np.float64) for k, v in load_file(paths.checkpoint / "model.safetensors").items()}
    config = json.loads((paths.checkpoint / "config.json").read_text())
    want_ids, want_logits = reference.greedy(tensors.__getitem__, config, PROMPT, STEPS)
    assert ids == want_ids
    for got, want in zip(logits, want_logits, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max())


def test_toy_family_s_norms_are_in_the_block_the_shared_builder_makes(toy_family: str) -> None:
    """Without the hook the post-norms' weights would be read and never used: the net must use them."""
    from llmbuild.families.registry import get_family
    from llmbuild.importer.nets import build_block
    from llmbuild.importer.shapes import Shapes

    spec = get_family(toy_family).spec_from_hf_config(CONFIG)
    text = str(build_block(spec, 0, "decode", Shapes(32, 8)))
    for name in OUTPUT_NORMS.values():
        assert f'"layers.0.{name}"' in text


def test_toy_family_s_norms_are_priced_by_the_cost_model(toy_family: str) -> None:
    from llmbuild.cost.ops import RMSNORM_OPS, block_ops
    from llmbuild.cost.weight_formats import weight_format

    spec = get_family(toy_family).spec_from_hf_config(CONFIG)
    fmt = weight_format("f32")
    ops = {op.name: op for op in block_ops(spec, fmt, "decode", 32, 8)}
    h = CONFIG["hidden_size"]
    for part in ("attn", "mlp"):
        norm = ops[f"{part}_output_norm"]
        assert (norm.eu_ops, norm.weight_bytes) == (h * RMSNORM_OPS, h * fmt.act_bytes)
        assert f"{part}_residual" in ops

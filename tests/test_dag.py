"""What reruns a step: the code digests the Snakemake rules put in each step's params."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llmbuild.steps import dag
from llmbuild.steps.descriptors import STEPS

PACKAGE = Path(dag.__file__).resolve().parents[1]


@pytest.fixture()
def package_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    copy = tmp_path / "llmbuild"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(dag, "PACKAGE_DIR", copy)
    dag._digest_of.cache_clear()
    yield copy
    dag._digest_of.cache_clear()


def _digests() -> dict[str, str]:
    dag._digest_of.cache_clear()
    dag.import_closure.cache_clear()
    return {step: dag.code_digest(step) for step in STEPS}


WEIGHT_STEPS = ("prepare", "quantize", "reference", "plan", "layer", "head", "check", "link", "e2e")


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_a_compiler_change_reruns_neither_prepare_nor_calibration(package_copy: Path) -> None:
    """A pass, kernel or codegen change rebuilds the layers, but not the float checkpoint or the minutes of
    GPTQ after it (prepare is every DAG's first step: its rerun would cascade to quantize)."""
    before = _digests()
    _append(package_copy / "passes" / "layer_group.py", "\n# a compiler change\n")
    after = _digests()
    # the steps that run the passes (a vision-language recipe's vit net too); link and e2e rerun only if
    # the objects they read change
    assert {s for s in before if after[s] != before[s]} == {"layer", "head", "vision"}


def test_an_edit_of_the_cli_reruns_nothing_that_reads_weights(package_copy: Path) -> None:
    before = _digests()
    _append(package_copy / "cli.py", "\n# a new verb\n")
    after = _digests()
    assert {s for s in WEIGHT_STEPS if after[s] != before[s]} == set()


def test_an_edit_of_the_simulator_runtime_recompiles_no_bmodel_net(package_copy: Path) -> None:
    """The cmodel runtime is what the checks run, not what compiles a net: an edit of it reruns the checks of a
    bmodel (a 7B's 59 nets are 18 minutes of job time), not its nets or combines."""
    nets = ("bmodel_block", "bmodel_embedding", "bmodel_lm_head", "bmodel_combine_layer", "bmodel_combine")
    before = _digests()
    _append(package_copy / "runtime" / "bmodel_cmodel.py", "\n# changed\n")
    after = _digests()
    assert {s for s in (*nets, "bmodel_check") if after[s] != before[s]} == {"bmodel_check"}


def test_the_closure_follows_function_level_imports() -> None:
    closure = dag.import_closure(("llmbuild.verify.reference",))
    assert "verify/stream_model.py" in closure  # imported inside make_reference only
    assert "cli.py" not in closure


@pytest.mark.parametrize("changed, reruns", [
    ("frontend/synthetic.py", {"prepare", "quantize", "reference", "layer", "head", "check", "e2e"}),
    ("quant/methods/gptq.py", {"quantize"}),  # the imported levels are read by quant/readers.py
    ("steps/prepare.py", {"prepare"}),
    ("verify/similarity.py", {"check", "e2e"}),
])
def test_what_a_step_reads_reruns_it(package_copy: Path, changed: str, reruns: set[str]) -> None:
    before = _digests()
    _append(package_copy / changed, "\n# changed\n")
    after = _digests()
    steps = ("prepare", "quantize", "reference", "layer", "head", "check", "e2e")
    assert {s for s in steps if after[s] != before[s]} == reruns


@pytest.mark.parametrize("config, jobs, per_job", [
    ("smollm2_135m_instruct_bf16.json", 2, {15}),  # 3.5M weights a layer: start-up would dominate
    ("deepseek_r1_distill_qwen_1_5b.json", 7, {4}),
    ("qwen2_7b_instruct_gptq_int4.json", 28, {1}),  # a 7B layer is a job: parallel, resumable, bounded
])
def test_layers_are_built_in_shards_sized_by_weights(config: str, jobs: int, per_job: set[int]) -> None:
    from llmbuild.frontend.config_spec import spec_from_hf_config_file
    from llmbuild.steps.shards import shard_layers

    spec = spec_from_hf_config_file(PACKAGE.parent / "recipes" / "configs" / config)
    shards = shard_layers(spec)
    assert len(shards) == jobs and {len(s) for s in shards} == per_job
    assert [i for s in shards for i in s] == list(range(spec.num_layers))  # every layer once, in order


def _digests_of(recipes: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> dict[str, str]:
    monkeypatch.setenv("LLMBUILD_RECIPES", str(recipes))
    dag.recipe.cache_clear()
    try:
        return {step: dag.digest(name, step) for step in STEPS}
    finally:
        dag.recipe.cache_clear()


@pytest.mark.parametrize("name, edit, reruns", [
    # quantization.lm_head rounds the reference's lm_head as well as the binary's
    ("qwen2_tiny_w4_rtn", "quantization:\n  lm_head: w8\n",
     {"reference", "plan", "layer", "head", "check", "e2e", "bmodel_block", "bmodel_embedding",
      "bmodel_embedding_cache", "bmodel_lm_head", "bmodel_lm_head_logits", "bmodel_check"}),
    # a synthetic vision-language checkpoint is written from vision.config (the vision step then reruns
    # because prepare rewrote its input)
    ("internvl_tiny_f32", "vision:\n  config:\n    vision_config:\n      num_hidden_layers: 3\n", {"prepare"}),
])
def test_a_recipe_edit_changes_the_digest_of_every_step_that_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, edit: str, reruns: set[str]) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(PACKAGE.parent / "recipes", recipes)
    before = _digests_of(recipes, monkeypatch, name)
    (recipes / f"{name}_edited.yaml").write_text(f"base: {name}\n{edit}")
    after = _digests_of(recipes, monkeypatch, f"{name}_edited")
    assert {s for s in before if after[s] != before[s]} == reruns


def test_an_edit_inside_a_family_s_folder_reruns_that_family_s_recipes_only(package_copy: Path) -> None:
    """The registry imports a family's folder by name, which no import statement shows: the steps that use
    it take the folders of the recipe's families. Qwen3.5's mixer is reached only that way."""
    recipes = ("qwen3_5_tiny_f32", "minicpmv4_6_tiny_f32", "qwen2_tiny_f32", "internvl_tiny_f32")

    def digests() -> dict[tuple[str, str], str]:
        dag._digest_of.cache_clear()
        dag.import_closure.cache_clear()
        return {(r, s): dag.code_digest(s, r) for r in recipes for s in ("layer", "reference", "verify")}

    before = digests()
    _append(package_copy / "families" / "qwen3_5" / "mixers.py", "\n# changed\n")
    after = digests()
    changed = {key for key in before if after[key] != before[key]}
    # MiniCPM-V 4.6's language model is Qwen3.5's; the recipe loader, in every step, reads the family
    assert changed == {(r, s) for r in recipes[:2] for s in ("layer", "reference", "verify")}
    assert "families/qwen3_5/mixers.py" not in dag.import_closure((*STEPS["layer"].entry, "llmbuild.recipe"))


def test_a_role_a_step_asks_the_registry_for_is_in_its_closure() -> None:
    """The vision step asks for a vision family's `model` role (the tower's export), prepare does not: an
    edit of InternVL's model.py reruns the one, not the other."""
    packages = dag.family_packages("internvl_tiny_f32")
    vision = dag._with_family_roles((*STEPS["vision"].entry, "llmbuild.recipe"), packages)
    prepare = dag._with_family_roles((*STEPS["prepare"].entry, "llmbuild.recipe"), packages)
    assert "families/internvl/model.py" in vision and "families/internvl/model.py" not in prepare

"""What reruns when a recipe field changes: the step descriptors, the view that records what a step reads,
and the table in docs/reruns.md. (tests/test_build.py checks the table against Snakemake's dry run and a
rebuild against a clean build.)"""

from __future__ import annotations

import dataclasses
import pickle
import re
from pathlib import Path

import pytest
from helpers import MINIMAL_RECIPE

from llmbuild.recipe import load_recipe
from llmbuild.recipe.reads import UndeclaredRead, covers, watch
from llmbuild.recipe.schema_table import FIELDS
from llmbuild.steps.descriptors import STEPS, net_step, step_of
from llmbuild.steps.rerun_table import REPRESENTATIVE, flips, step_digests, table_markdown

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
VALID = MINIMAL_RECIPE


@pytest.fixture(scope="module")
def table() -> dict[str, dict[str, tuple[set[str], set[str]]]]:
    """recipe -> field -> (steps that read it, steps that then rerun)."""
    return {name: {f.field: (set(f.direct), set(f.downstream)) for f in flips(name, RECIPES)}
            for name in REPRESENTATIVE}


def test_the_page_is_what_the_code_computes() -> None:
    assert (ROOT / "docs" / "reruns.md").read_text() == table_markdown(RECIPES), (
        "docs/reruns.md is stale: python -c 'from llmbuild.steps.rerun_table import update_doc; "
        "update_doc(\"docs/reruns.md\")'")


def test_every_field_of_the_schema_is_flipped_on_every_representative_recipe(table) -> None:
    fields = {f.path for f in FIELDS if f.type != "section"}
    for name, rows in table.items():
        assert set(rows) == fields, name


def test_the_two_stale_cases_rerun(table) -> None:
    # quantization.lm_head rounds the reference's lm_head too; it used to leave the reference stale
    assert "reference" in table["qwen2_tiny_w4_rtn"]["quantization.lm_head"][0]
    # a synthetic vision-language checkpoint is written from vision.config; it used to leave prepare stale
    assert table["internvl_tiny_f32"]["vision.config"][0] == {"prepare"}
    assert "vision" in table["internvl_tiny_f32"]["vision.config"][1]


def test_each_step_reruns_for_some_field_and_only_for_what_it_reads(table) -> None:
    direct = set().union(*(d for rows in table.values() for d, _ in rows.values()))
    assert direct == {name for name, step in STEPS.items() if step.declared}  # the final combine reads no field
    f32 = table["qwen2_tiny_f32"]
    assert f32["description"] == (set(), set())
    for tolerance in ("verify.top_cosine", "verify.tpu_euclid", "verify.logits_cosine", "verify.exact_tokens"):
        assert f32[tolerance] == ({"verify"}, set())
    # the float reference reads the weights' rounding, not the activation type
    assert "reference" not in f32["quantization.mode"][0] | f32["quantization.mode"][1]
    # a float build ignores the group size
    assert f32["quantization.group_size"] == (set(), set())
    # the history form changes the blocks, not the head's nets
    assert table["qwen2_tiny_w4_rtn"]["bmodel.history"][0] == {"bmodel_block", "bmodel_combine_layer", "bmodel_check"}
    # the head's nets know nothing of the KV cache: a cache length recompiles the blocks alone
    assert not f32["stages.seq_length"][0] & {"bmodel_embedding", "bmodel_embedding_cache", "bmodel_lm_head"}


def test_declared_fields_are_fields_of_the_recipe() -> None:
    known = {f.path for f in FIELDS} | {"quantization.checkpoint"}
    for step in STEPS.values():
        assert set(step.declared) <= known, step.name


def test_every_rule_runs_its_step_through_the_descriptor() -> None:
    """The rules take each step's command from its descriptor: no rule spells a build verb itself."""
    verbs = {s.verb for s in STEPS.values()}
    for path in sorted((ROOT / "rules").glob("*.smk")):
        spelled = set(re.findall(r"llmbuild ([a-z-]+) \{", path.read_text())) & verbs
        assert not spelled, f"{path.name} spells {spelled}"
    from llmbuild.cli import build_parser

    parser_verbs = set(build_parser()._subparsers._group_actions[0].choices)
    assert verbs <= parser_verbs


def test_a_bmodel_net_is_its_kind_s_step() -> None:
    assert {net_step(n) for n in ("block_0", "block_cache_3", "block_kv_1")} == {"bmodel_block"}
    assert step_of("bmodel-net", "lm_head") == "bmodel_lm_head" and step_of("bmodel-net", "vit") == "bmodel_vit"
    assert step_of("run") is None


def test_a_step_s_digest_is_what_it_reads_and_nothing_else(tmp_path: Path) -> None:
    """The digest hashes the declared fields' values as the step sees them: not the recipe's name or file, not
    its key order, not whether a default is written out; a field the step does not read changes nothing."""
    def digests(text: str, name: str) -> dict[str, str]:
        (tmp_path / f"{name}.yaml").write_text(text)
        return step_digests(load_recipe(name, tmp_path))

    one = digests(VALID, "one")
    assert re.fullmatch(r"[0-9a-f]{16}", one["layer"])
    assert digests(VALID, "two") == one  # another name, the same recipe
    reordered = "stages:\n  prefill_length: 16\n  seq_length: 64\n" + VALID.replace(
        "stages:\n  seq_length: 64\n  prefill_length: 16\n", "")
    assert digests(reordered, "r") == one
    explicit = digests(VALID + "quantization: {mode: f32}\ntarget: {chip: bm1684x}\n", "e")
    assert explicit == one  # an explicit default and an absent field are the same recipe
    tolerance = digests(VALID.replace("top_cosine: 0.99", "top_cosine: 0.9"), "v")
    assert {s for s in one if tolerance[s] != one[s]} == {"verify"}
    bf16 = digests(VALID + "quantization: {mode: bf16}\n", "q")
    assert bf16["layer"] != one["layer"] and bf16["reference"] == one["reference"] and bf16["prepare"] == one["prepare"]


# The view a step reads its recipe through.

def test_the_view_records_fields_and_fails_an_undeclared_read_naming_it() -> None:
    recipe = load_recipe("qwen2_tiny_w4_rtn")
    view, log = watch(recipe, "plan", covers(("stages", "quantization.mode")), strict=True)
    assert view.stages.seq_length == recipe.stages.seq_length and view.quantization.mode == "w4bf16"
    assert view.name == recipe.name  # identity, not a field
    assert log.fields == {"stages.seq_length", "quantization.mode"}
    with pytest.raises(UndeclaredRead, match=r"step plan read recipe field verify\.prompt_ids"):
        view.verify.prompt_ids  # noqa: B018 - the read is the test
    with pytest.raises(UndeclaredRead, match=r"quantization\.lm_head"):
        view.raw["quantization"]["lm_head"]  # noqa: B018
    assert view.raw["stages"]["prefill_length"] == 16 and "stages.prefill_length" in log.fields


def test_the_view_behaves_as_the_recipe() -> None:
    recipe = load_recipe("internvl_tiny_f32")
    view, log = watch(recipe, "link", covers(("*",)), strict=True)
    assert isinstance(view, type(recipe)) and isinstance(view.quantization, type(recipe.quantization))
    replaced = dataclasses.replace(view.stages, seq_length=128)
    assert replaced.seq_length == 128 and replaced.prefill_length == recipe.stages.prefill_length
    plain = pickle.loads(pickle.dumps(view.vision))
    assert type(plain) is type(recipe.vision) and plain == recipe.vision
    assert "vision.*" in log.fields  # pickled whole: every field of the section read


def test_reading_an_absent_section_is_covered_by_a_field_inside_it() -> None:
    recipe = load_recipe("qwen2_tiny_f32")
    view, log = watch(recipe, "verify", covers(("vision.family",)), strict=True)
    assert view.vision is None and log.fields == {"vision"}
    view, _ = watch(recipe, "plan", covers(("stages",)), strict=True)
    with pytest.raises(UndeclaredRead):
        view.vision  # noqa: B018

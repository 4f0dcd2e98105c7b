"""One malformed recipe in the folder fails its own target with the loader's one line, and `all` still
builds every other recipe (rules/common.smk, build/dag.py: recipe_problems)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import ROOT, planned_jobs, snakemake


def test_a_broken_recipe_fails_alone(tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    for name in ("_tiny_common.yaml", "qwen2_tiny_f32.yaml"):
        shutil.copy(ROOT / "recipes" / name, recipes / name)
    (recipes / "broken_one.yaml").write_text("base: qwen2_tiny_f32\nstages:\n  seq_length: big\n")
    build = tmp_path / "build"

    jobs = planned_jobs(build, "all", recipes)
    assert jobs["prepare"] == 1 and jobs["verify"] == 1 and "broken_one" not in jobs  # qwen2_tiny_f32 only

    result = snakemake(build, "broken_one", recipes=recipes, check=False)
    assert result.returncode != 0
    expected = "broken_one.yaml:3: stages.seq_length: expected an integer, got string 'big'"
    lines = [line for line in result.stderr.splitlines() if line.startswith("llmbuild: error:")]
    assert lines and expected in lines[-1], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (build / "broken_one").exists()


@pytest.mark.parametrize(("body", "line", "expected"), [
    ("quantization:\n  mode: w4bf16\n  group_size: 48\n", 4,
     "quantization.group_size: expected a group size dividing every projection's inputs, got 48, which does "
     "not divide hidden_size 64"),
    ("source:\n  config:\n    num_key_value_heads: 3\n", 4,
     "source.config.num_key_value_heads: num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ("source:\n  config:\n    hidden_size: big\n", 4, "source.config.hidden_size: hidden_size must be a positive"),
    ("source:\n  config:\n    num_hidden_layers: -1\n", 4,
     "source.config.num_hidden_layers: num_hidden_layers must be a positive"),
    ("source:\n  config:\n    vocab_size: 100000000000\n", 4,
     "source.config.vocab_size: vocab_size 100000000000: expected at"),
])
def test_model_faults_are_load_time_errors_at_the_recipe_line(tmp_path: Path, body: str, line: int,
                                                               expected: str) -> None:
    from llmbuild import LlmbuildError
    from llmbuild.recipe import load_recipe

    for name in ("_tiny_common.yaml", "qwen2_tiny_f32.yaml"):
        shutil.copy(ROOT / "recipes" / name, tmp_path / name)
    (tmp_path / "bad.yaml").write_text("base: qwen2_tiny_f32\n" + body)
    with pytest.raises(LlmbuildError) as err:
        load_recipe("bad", tmp_path)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'bad.yaml'}:{line}: ") and expected in message, message
    assert "\n" not in message

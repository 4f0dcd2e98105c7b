"""One malformed recipe in the folder fails its own target with the loader's one line, and `all` still
builds every other recipe (rules/common.smk, build/dag.py: recipe_problems)."""

from __future__ import annotations

import shutil
from pathlib import Path

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

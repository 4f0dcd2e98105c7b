"""Snakemake configuration the Snakemake way: config/config.yaml validated against config/schema.yaml,
overridable with --config and --configfile (a .test/ configuration builds one tiny recipe), each key
falling back to its environment variable (llmbuild/steps/workflow_config.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

from llmbuild import LlmbuildError
from llmbuild.steps.workflow_config import WorkflowConfig, apply_workflow_config, selected


def _dry_run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMBUILD_")}
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def _jobs(out: str) -> set[str]:
    lines = out.splitlines()
    start = lines.index("Job stats:") + 3
    return {line.split()[0] for line in lines[start:] if len(line.split()) == 2 and line.split()[0] != "total"}


def test_the_test_configuration_builds_one_tiny_recipe() -> None:
    result = _dry_run("--configfile", ".test/config/config.yaml")
    assert result.returncode == 0, result.stderr[-2000:]
    jobs = _jobs(result.stdout)
    assert "all" in jobs and "verify" in jobs
    assert {j for j in jobs if j.startswith("layers_")} == {"layers_qwen2_tiny_f32_0_1", "layers_qwen2_tiny_f32_2_3"}
    assert f"{ROOT / '.test' / 'build' / 'qwen2_tiny_f32'}" in result.stdout or ".test/build/qwen2_tiny_f32" in (
        result.stdout)


def test_config_on_the_command_line_moves_the_build(tmp_path: Path) -> None:
    result = _dry_run("qwen2_tiny_f32", "--config", f"build_dir={tmp_path / 'elsewhere'}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"output: {tmp_path / 'elsewhere' / 'qwen2_tiny_f32' / 'spec.json'}" in result.stdout


@pytest.mark.parametrize(("config", "expected"), [
    ("build_dir=5", "5 is not of type 'string', 'null'"),
    ("buld_dir=x", "Additional properties are not allowed ('buld_dir' was unexpected)"),
    ("recipes=[Bad name]", "does not match"),
])
def test_a_bad_configuration_is_refused_by_its_schema(config: str, expected: str) -> None:
    result = _dry_run("--config", config)
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "Error validating config file" in out and expected in out, out[-2000:]


def test_keys_fall_back_to_the_environment_and_are_exported(monkeypatch: pytest.MonkeyPatch) -> None:
    # setenv first, so that monkeypatch restores every variable the function exports (delenv of an unset
    # variable records nothing, and the export would outlive the test).
    for name in ("LLMBUILD_BUILD_DIR", "LLMBUILD_RECIPES", "LLMBUILD_MODELS"):
        monkeypatch.setenv(name, "unset-by-the-test")
    monkeypatch.setenv("LLMBUILD_BUILD_DIR", "/from/env")
    monkeypatch.delenv("LLMBUILD_RECIPES")
    monkeypatch.delenv("LLMBUILD_MODELS")
    config = apply_workflow_config({"build_dir": None, "recipes_dir": "/r", "models_dir": None, "recipes": None})
    assert (config.build_dir, config.recipes_dir, config.models_dir) == ("/from/env", "/r", None)
    assert os.environ["LLMBUILD_RECIPES"] == "/r" and "LLMBUILD_MODELS" not in os.environ
    assert apply_workflow_config({"build_dir": "/given"}).build_dir == "/given"  # the file or --config wins
    assert os.environ["LLMBUILD_BUILD_DIR"] == "/given"


def test_the_recipes_all_builds() -> None:
    config = WorkflowConfig("build", "recipes", None, ("b",))
    assert selected(config, ["a", "b"]) == ["b"]
    assert selected(WorkflowConfig("build", "recipes", None, None), ["a", "b"]) == ["a", "b"]
    with pytest.raises(LlmbuildError, match=r"config: recipes: expected recipes in recipes \(a, b\), got c"):
        selected(WorkflowConfig("build", "recipes", None, ("c",)), ["a", "b"])

"""A real-size layer through the whole build, on every change: two layers with Qwen2-7B's exact shapes and
GPTQ v1 packing (benchmarks/make_checkpoint.py, random weights, a small vocabulary), built by the shipped
`qwen2_7b_w4` recipe through Snakemake. The full 7B/8B builds and their memory and time are the
benchmark's (benchmarks/scale.py, docs/performance.md); this keeps the streamed reference, the weight
files, the sampled device checks and the disk bound exercised."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, llmbuild, planned_jobs, snakemake

RECIPE = "qwen2_7b_w4"


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    models = tmp_path_factory.mktemp("models")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_checkpoint.py"), "--model", "qwen2_7b_gptq",
                    "--out", str(models), "--layers", "2", "--vocab-size", "1024"], check=True, capture_output=True)
    out = tmp_path_factory.mktemp("build")
    snakemake(out, RECIPE, models=models)
    return out, models


def test_two_7b_layers_build_and_verify(build: tuple[Path, Path]) -> None:
    out, _ = build
    report = json.loads((out / RECIPE / "verify.json").read_text())
    assert report["passed"], report["failures"]
    assert report["worst_cosine"]["top_vs_source"] >= 0.9999
    executors = {json.loads((out / RECIPE / "layers" / str(i) / "metrics.json").read_text())["stages"]["prefill"]
                 ["executor"] for i in range(2)}
    assert executors == {"device"}  # two layers: the first and the last, both on the simulated device


def test_the_build_directory_holds_the_weights_once(build: tuple[Path, Path]) -> None:
    out, _ = build
    root = out / RECIPE
    binary = (root / f"{RECIPE}.llmb").stat().st_size
    assert not list(root.rglob("weights.safetensors"))  # temporary: deleted once linked
    total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert total <= 2 * binary, f"{total / binary:.2f}x the binary"


def test_the_binary_answers_as_its_end_to_end_check_says(build: tuple[Path, Path]) -> None:
    out, models = build
    e2e = json.loads((out / RECIPE / "e2e.json").read_text())
    result = llmbuild(out, "run", RECIPE, "--prompt-ids", ",".join(map(str, e2e["prompt_ids"])),
                      "--max-new-tokens", "4", "--ignore-eos", "--json", env={"LLMBUILD_MODELS": str(models)})
    assert result.returncode == 0, result.stderr
    # e2e's ids are the binary's choices along the reference's run (teacher-forced): a free run follows them
    # up to and including the first step where they part from the reference's.
    same = 4 if e2e["first_difference"] is None else min(4, e2e["first_difference"] + 1)
    assert json.loads(result.stdout)["ids"][:same] == e2e["ids"][:same]


def test_a_changed_tolerance_reruns_only_verify(build: tuple[Path, Path], tmp_path: Path) -> None:
    out, models = build
    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", recipes)
    assert planned_jobs(out, RECIPE, recipes, models) == {}
    path = recipes / f"{RECIPE}.yaml"
    path.write_text(path.read_text().replace("exact_tokens: false", "exact_tokens: false\n  tpu_cosine: 0.995"))
    assert planned_jobs(out, RECIPE, recipes, models) == {"verify": 1, RECIPE: 1}

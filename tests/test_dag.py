"""What reruns a step: the code digests the Snakemake rules put in each step's params."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llmbuild.build import dag

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
    return {step: dag.code_digest(step) for step in ("prepare", "quantize", "compile", "reference")}


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_a_compiler_change_reruns_neither_prepare_nor_calibration(package_copy: Path) -> None:
    """A pass, kernel or codegen change rebuilds the layers, but not the float checkpoint or the minutes of
    GPTQ after it (prepare is every DAG's first step: its rerun would cascade to quantize)."""
    before = _digests()
    _append(package_copy / "passes" / "layer_group.py", "\n# a compiler change\n")
    after = _digests()
    assert after["prepare"] == before["prepare"] and after["quantize"] == before["quantize"]
    assert after["compile"] != before["compile"] and after["reference"] != before["reference"]


@pytest.mark.parametrize("changed, reruns", [
    ("frontend/synthetic.py", {"prepare", "quantize", "compile"}),  # the float weights themselves
    ("quant/methods/gptq.py", {"quantize", "compile"}),
    ("build/prepare.py", {"prepare", "compile"}),
])
def test_what_a_step_reads_reruns_it(package_copy: Path, changed: str, reruns: set[str]) -> None:
    before = _digests()
    _append(package_copy / changed, "\n# changed\n")
    after = _digests()
    assert {s for s in ("prepare", "quantize", "compile") if after[s] != before[s]} == reruns

"""The runtime stands without the compiler: in a fresh virtual environment holding only the runtime's
dependencies (numpy, PyYAML, Jinja2, tokenizers, llvmlite; no xDSL, torch, transformers, Snakemake, safetensors or
gguf), `llmbuild run` on a binary built here gives the same tokens as in the full environment."""

from __future__ import annotations

import json
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from helpers import ROOT

# The runtime's dependencies (pyproject.toml `dependencies`) as installed here: import names and the
# shared-library folders beside them.
RUNTIME_PACKAGES = ("numpy", "numpy.libs", "yaml", "_yaml", "jinja2", "markupsafe", "tokenizers", "llvmlite")
COMPILER_PACKAGES = ("xdsl", "torch", "transformers", "snakemake", "safetensors", "gguf")


def _runtime_only_venv(folder: Path) -> Path:
    """A venv whose site-packages links the runtime's packages from this one, plus the llmbuild sources."""
    venv.create(folder, with_pip=False)
    python = folder / "bin" / "python"
    target = Path(subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    here = Path(next(p for p in site.getsitepackages() if (Path(p) / "numpy").is_dir()))
    for name in RUNTIME_PACKAGES:
        if (here / name).exists():
            (target / name).symlink_to(here / name)
    (target / "llmbuild_source.pth").write_text(f"{ROOT}\n")
    return python


def _run_ids(python: Path, binary: Path) -> list[int]:
    result = subprocess.run([python, "-m", "llmbuild.cli", "run", str(binary), "--prompt", "hello there",
                             "--max-new-tokens", "8", "--json"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)["ids"]


def test_llmbuild_run_in_a_venv_without_the_compiler(runtime_build: Path, tmp_path: Path) -> None:
    binary = runtime_build / "qwen2_tiny_f32" / "qwen2_tiny_f32.llmb"
    python = _runtime_only_venv(tmp_path / "runtime-venv")
    for name in COMPILER_PACKAGES:
        probe = subprocess.run([python, "-c", f"import {name}"], capture_output=True, text=True)
        assert probe.returncode != 0, f"{name} is importable in the runtime-only venv"
    alone = _run_ids(python, binary)
    assert len(alone) == 8 and alone == _run_ids(Path(sys.executable), binary)
    inspect = subprocess.run([python, "-m", "llmbuild.cli", "inspect", str(binary), "--json"], capture_output=True,
                             text=True, timeout=300)
    assert inspect.returncode == 0 and json.loads(inspect.stdout)["nets"], inspect.stderr[-2000:]


@pytest.mark.parametrize("module", ["llmbuild.runtime.session", "llmbuild.runtime.inspect_binary",
                                    "llmbuild.binary.program", "llmbuild.cli",
                                    # what VisionNet asks the registry for, for a MiniCPM-V or an InternVL binary
                                    "llmbuild.families.minicpmv.runtime", "llmbuild.families.internvl.runtime",
                                    "llmbuild.families.internvl.family"])
def test_runtime_modules_import_no_compiler_package(module: str) -> None:
    code = (f"import sys, {module}; heavy = sorted({{m.split('.')[0] for m in sys.modules}} & "
            f"{set(COMPILER_PACKAGES)!r}); print(heavy)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout

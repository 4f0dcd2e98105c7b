import os
from pathlib import Path

import pytest

import llmbuild  # noqa: F401  (first: it pins OpenBLAS's kernels before anything loads numpy)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RUNTIME_RECIPES = ("qwen2_tiny_f32", "llama_tiny_f32", "smollm2_135m_bf16")


@pytest.fixture(scope="session")
def build_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build directory for the whole test session. Snakemake builds into it incrementally, so a recipe
    one test file needs is built once, whichever file asks first."""
    return tmp_path_factory.mktemp("llmbuild") / "build"


@pytest.fixture(scope="session")
def runtime_build(build_root: Path) -> Path:
    """The binaries the runtime tests use, built from clean (a no-op when `all` was built already).

    LLMBUILD_TEST_PREBUILT=DIR uses binaries already built in DIR instead (a quick loop while working on
    the runtime; CI never sets it)."""
    from helpers import snakemake

    prebuilt = os.environ.get("LLMBUILD_TEST_PREBUILT")
    if prebuilt:
        return Path(prebuilt)
    snakemake(build_root, *RUNTIME_RECIPES)
    return build_root

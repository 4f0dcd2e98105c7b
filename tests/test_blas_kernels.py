"""One BLAS arithmetic on every host: llmbuild pins numpy's OpenBLAS to its Haswell kernels
(llmbuild/blas_kernels.py), since its AVX-512 kernels sum in another order and flipped SmolLM2's near-tie
first reply token (tests/test_build.py asks for "Paris")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llmbuild import blas_kernels

needs_avx2 = pytest.mark.skipif(not blas_kernels._has_avx2_and_fma() or os.uname().machine != "x86_64",
                                reason="the pin applies to x86-64 CPUs with AVX2 and FMA")
PROBE = "import llmbuild, numpy; from llmbuild.runtime.blas import kernel_name; print(kernel_name())"


def _kernel(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"} | env_extra
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


@needs_avx2
def test_importing_llmbuild_first_pins_the_haswell_kernels() -> None:
    assert _kernel({}) == blas_kernels.PINNED


@needs_avx2
def test_a_users_own_choice_of_kernels_wins() -> None:
    assert _kernel({"OPENBLAS_CORETYPE": "Sandybridge"}) == "Sandybridge"  # AVX: any CPU with AVX2 runs it


@needs_avx2
def test_this_test_process_runs_the_pinned_kernels() -> None:
    """conftest.py imports llmbuild before anything loads numpy: in-process results are the ones the
    llmbuild processes the tests start compute."""
    from llmbuild.runtime.blas import kernel_name

    assert kernel_name() == blas_kernels.PINNED


@needs_avx2
def test_the_runtime_warns_when_numpy_loaded_other_kernels_first() -> None:
    """numpy imported before llmbuild keeps the CPU's own kernels: loading a binary says so."""
    probe = ("import numpy, warnings; import llmbuild; from llmbuild.runtime import blas; "
             "warnings.simplefilter('error'); blas.warn_if_unpinned()")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"} | {"OPENBLAS_CORETYPE": "Sandybridge"}
    quiet = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert quiet.returncode == 0, quiet.stderr  # the user's own choice took: nothing to say
    # numpy loads the Sandybridge kernels, then the process asks for Haswell too late.
    late = subprocess.run([sys.executable, "-c", probe.replace("import llmbuild; ", "import os; "
                          "os.environ['OPENBLAS_CORETYPE'] = 'Haswell'; import llmbuild; ")],
                          env=env, capture_output=True, text=True)
    assert late.returncode != 0 and "RuntimeWarning" in late.stderr and "not Haswell" in late.stderr, late.stderr

"""runtime/cmodel_yield.c: a process that loads it runs ENGINE_NICE (10) steps lower in priority, every
thread it starts with it, and never higher than it was (the yielding itself: tests/test_bmodel_build.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmbuild.runtime.cmodel_yield import library

# The priority of the main thread and of a thread it starts.
PROBE = ("import os, threading; seen = []; t = threading.Thread(target=lambda: seen.append(os.nice(0))); "
         "t.start(); t.join(); print(os.nice(0), seen[0])")


def _priorities(base: int, preload: bool) -> tuple[int, int]:
    lib = library()
    if lib is None:
        pytest.skip("the library cannot be compiled here (no gcc, or not Linux)")
    env = {"PATH": "/usr/bin:/bin", **({"LD_PRELOAD": str(lib)} if preload else {})}
    out = subprocess.run(["nice", "-n", str(base), sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
    return int(out[0]), int(out[1])


@pytest.mark.parametrize(("base", "expected"), [(0, 10), (3, 13), (15, 19)])
def test_the_preloaded_process_and_its_threads_run_lower(base, expected):
    assert _priorities(base, preload=False) == (base, base)
    assert _priorities(base, preload=True) == (expected, expected)

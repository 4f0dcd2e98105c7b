"""llmbuild keeps freed memory in the process (allocator.py): a freed 20 MB temporary stays resident
for the next one instead of being unmapped and faulted in again, and numpy asks for no huge pages; a
user's own setting wins."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")

_PROBE = """
import json, llmbuild, numpy as np
from llmbuild import allocator
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
a = np.ones(5 << 20, dtype=np.float32)  # 20 MiB, below glibc's largest mmap threshold
held = rss()
del a
print(json.dumps({"tuned_again": allocator.tune_every_process(), "freed_mib": (held - rss()) / 2**20,
                  "huge_pages": bool(np._core.multiarray._get_madvise_hugepage())}))
"""


def _probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "NUMPY_MADVISE"))}
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**clean, **env}, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def test_freed_temporaries_stay_in_the_process() -> None:
    tuned = _probe()
    assert tuned["tuned_again"]
    assert tuned["freed_mib"] < 4, tuned  # kept for the next temporary
    assert not tuned["huge_pages"]  # numpy imported after llmbuild: no compaction stalls on faults


def test_a_users_malloc_setting_wins() -> None:
    untouched = _probe(MALLOC_TOP_PAD_="131072", NUMPY_MADVISE_HUGEPAGE="1")
    assert not untouched["tuned_again"] and untouched["huge_pages"]
    assert untouched["freed_mib"] > 16, untouched  # glibc's default: the array's own mapping, unmapped

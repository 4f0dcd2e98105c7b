"""Machine code of the compiled products kept between processes (LLVM's object cache for MCJIT).

Optimizing and generating the product kernels' machine code takes about a quarter of a second in every
process that multiplies (the many-row product alone is 100 KB of IR): `llmbuild run` before its first
token, and every check job of a build. The object file LLVM produces depends only on the IR, the CPU it is
compiled for, its features and the LLVM in llvmlite, so it is kept under that key in the user's cache folder
(`$XDG_CACHE_HOME/llmbuild/kernels`, else `~/.cache/llmbuild/kernels`) and handed back to MCJIT instead of
compiling again: the same machine code, so the same bits. A cache that cannot be read or written is
skipped (the kernels are compiled as before); `LLMBUILD_KERNEL_CACHE=0` turns it off.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

ENV = "LLMBUILD_KERNEL_CACHE"


def folder() -> Path | None:
    """Where the objects are kept; None when turned off."""
    if os.environ.get(ENV) == "0":
        return None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmbuild" / "kernels"


def key(ir: str, cpu: str, features: str, llvm_version: str) -> str:
    """The object's name: everything its machine code depends on, hashed."""
    digest = hashlib.sha256("\0".join((llvm_version, cpu, features, ir)).encode()).hexdigest()
    return f"{digest[:32]}.o"


def load(name: str) -> bytes | None:
    place = folder()
    if place is None:
        return None
    try:
        return (place / name).read_bytes()
    except OSError:
        return None


def store(name: str, data: bytes) -> None:
    """Written whole or not at all: parallel build jobs may each compile, one file wins."""
    place = folder()
    if place is None or (place / name).is_file():
        return
    try:
        place.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=place, delete=False, suffix=".tmp") as tmp:
            tmp.write(data)
        os.replace(tmp.name, place / name)
    except OSError:
        return

"""The vendor cmodel's engine threads made to yield while they poll (cmodel_yield.c, preloaded).

Each engine of the simulated chip is a thread that polls its queue without sleeping; on two cores the seven
of them take turns with the one engine that has work, so a net's launch spends most of its CPU in
`pthread_mutex_lock`/`unlock` (a profile of a 1.5B decode block: 65%). The library this module compiles
(from the C source beside it, with the system's `gcc`, once per source into a user cache folder) replaces
`pthread_mutex_unlock` with one that calls `sched_yield()` afterwards in those threads only. It must be in
`LD_PRELOAD` when the process starts, so a command that runs the cmodel re-executes itself with it
(`reexec_with_yield`). The process also runs ten steps lower in priority (once per process tree), so a
neighbouring job keeps its core while the engines wait. The simulation is the same instruction for
instruction: the same bits, sooner on an otherwise idle machine, and beside another job slower, as the
engines give that job its core (docs/bmodel.md has the figures).

`LLMBUILD_CMODEL_YIELD=0` turns it off. Without `gcc` the cmodel runs as it is, slower.

This module is part of the runtime: stdlib only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

ENV = "LLMBUILD_CMODEL_YIELD"  # "0": off; "1" once set by the re-execution (so it happens once)
_SOURCE = "cmodel_yield.c"
_PREFIX = "cmodel-yield-"  # the compiled library's file name: the prefix, then the source's digest


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmbuild"


def library() -> Path | None:
    """The compiled library, compiled now if this source has not been; None where it cannot be (no gcc, an
    unwritable cache) or is turned off."""
    if os.environ.get(ENV) == "0" or not sys.platform.startswith("linux"):
        return None
    source = resources.files("llmbuild.runtime").joinpath(_SOURCE).read_bytes()
    target = _cache_dir() / f"{_PREFIX}{hashlib.sha256(source).hexdigest()[:16]}.so"
    if target.is_file():
        return target
    gcc = shutil.which("gcc")
    if gcc is None:
        return None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src, out = Path(tmp) / _SOURCE, Path(tmp) / target.name
            src.write_bytes(source)
            subprocess.run([gcc, "-O2", "-shared", "-fPIC", "-o", str(out), str(src), "-ldl"], check=True,
                           capture_output=True, timeout=120)
            os.replace(out, target)  # atomic: parallel jobs each compile, one file wins whole
    except (OSError, subprocess.SubprocessError):
        return None
    return target


def preload_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (else this process's) with the library in LD_PRELOAD, for a subprocess that runs the cmodel."""
    out = dict(os.environ if env is None else env)
    lib = library()
    if lib is not None and str(lib) not in out.get("LD_PRELOAD", "").split(":"):
        out["LD_PRELOAD"] = ":".join(p for p in (str(lib), out.get("LD_PRELOAD", "")) if p)
        out[ENV] = "1"
    return out


def engines_yield() -> bool:
    """Whether this process runs the cmodel with the library preloaded."""
    return os.environ.get(ENV) == "1" and any(Path(p).name.startswith(_PREFIX)
                                               for p in os.environ.get("LD_PRELOAD", "").split(":"))


def reexec_with_yield() -> None:
    """Start this command again with the library preloaded, unless it is already (or cannot be): called by a
    command before it loads the cmodel, with nothing done yet that a second start would repeat."""
    if os.environ.get(ENV) in ("0", "1"):
        return
    env = preload_env()
    if env.get(ENV) != "1":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)  # the same interpreter options too

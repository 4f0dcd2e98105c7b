"""Where the vendor's native toolchain (TPU-MLIR's `tpuc-opt`, `model_tool` and runtime libraries) lives, and
the environment its tools need. Standard library only: the compiler's bmodel steps and the runtime's cmodel
runner both find the toolchain here.

The toolchain is one pinned release of the `tpu-mlir` wheel, unpacked by `scripts/install.sh` into the
active environment (`<prefix>/opt/tpu-mlir-<version>/tpu_mlir`) with `pip --target`: the wheel declares
Python 3.10, but its tools are native executables and libraries that any process can run. The wheel bundles
Ubuntu's glibc, which breaks every tool on a newer system glibc; the install moves those three files aside
and `check` refuses an unpacked wheel that still has them.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from llmbuild import LlmbuildError

VERSION = "1.30.2"
# Set to a `tpu_mlir` package directory (the one holding bin/ and lib/) to use another unpacked copy.
ENV_VAR = "LLMBUILD_TPU_MLIR"
# The bundled glibc files that must not be found first (their RUNPATH puts lib/third_party before the system).
BUNDLED_GLIBC = ("libc.so.6", "libm.so.6", "libpthread.so.0")
# What the attention kernel's just-in-time compile runs besides the wheel's own PPL compiler.
SYSTEM_TOOLS = ("cmake", "make", "gcc", "g++")


class ToolchainError(LlmbuildError):
    """The vendor toolchain is absent or cannot run here; the message is one line saying what to do."""


def default_root() -> Path:
    return Path(sys.prefix) / "opt" / f"tpu-mlir-{VERSION}" / "tpu_mlir"


@dataclass(frozen=True)
class Toolchain:
    root: Path  # the tpu_mlir package directory

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def lib(self) -> Path:
        return self.root / "lib"

    @property
    def tpuc_opt(self) -> Path:
        return self.bin / "tpuc-opt"

    @property
    def model_tool(self) -> Path:
        return self.bin / "model_tool"

    @property
    def bmodel_schema(self) -> Path:
        """The flatbuffer schema of the bmodel files this version writes (read by bmodel/combine.py)."""
        return self.root / "include" / "tpu_mlir" / "Builder" / "BM168x" / "bmodel.fbs"

    @property
    def ppl_root(self) -> Path:
        return self.root / "cross_toolchains" / "ppl_compile"

    def environment(self, workdir: Path, jit_home: Path) -> dict[str, str]:
        """The environment `tpuc-opt` needs: without any of these its layer-group step segfaults. `jit_home`
        holds the attention kernel's compile cache ($HOME/.ppl/cache), shared by every net of a build."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "PYTHON"))}
        env.update({
            "PWD": str(workdir),
            "HOME": str(jit_home),
            "TPUC_ROOT": str(self.root),
            "PPL_PROJECT_ROOT": str(self.ppl_root),
            "PPL_RUNTIME_PATH": str(self.ppl_root / "deps"),
            "PATH": f"{self.ppl_root / 'bin'}:{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            # Deterministic outputs: no locale- or time-zone-dependent text from the tools.
            "LC_ALL": "C",
            "TZ": "UTC",
        })
        return env


def locate() -> Toolchain:
    """The pinned toolchain, checked; ToolchainError (one line) when it is missing or cannot run here."""
    configured = os.environ.get(ENV_VAR)
    root = Path(configured) if configured else default_root()
    where = f"{ENV_VAR}={configured}" if configured else str(root)
    if not (root / "bin" / "tpuc-opt").is_file():
        raise ToolchainError(
            f"TPU-MLIR {VERSION} is not installed at {where}: run scripts/install.sh (or set {ENV_VAR} to an "
            "unpacked tpu_mlir package directory) to build .bmodel binaries")
    chain = Toolchain(root)
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        raise ToolchainError(f"TPU-MLIR's tools are x86-64 Linux executables; this machine is "
                             f"{sys.platform} {os.uname().machine}: build .llmb binaries only here")
    bundled = [name for name in BUNDLED_GLIBC if (chain.lib / "third_party" / name).exists()]
    if bundled:
        raise ToolchainError(
            f"{chain.lib / 'third_party'} still holds the wheel's own glibc ({', '.join(bundled)}), which makes "
            "every tool crash: move those files aside (scripts/install.sh does)")
    missing = [tool for tool in SYSTEM_TOOLS if shutil.which(tool) is None]
    if missing:
        raise ToolchainError(
            f"TPU-MLIR's attention-kernel compile needs {', '.join(missing)} on PATH (Debian: apt-get install "
            "cmake make gcc g++)")
    return chain


__all__ = ["VERSION", "Toolchain", "ToolchainError", "locate"]

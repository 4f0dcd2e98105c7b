"""What every library run needs around it: the library imported lazily (a one-line error when it is
missing), seeded and thread-pinned torch for reproducible output, and the libraries' chatter kept off
stdout (the build's stdout is for llmbuild's own lines)."""

from __future__ import annotations

import contextlib
import importlib
import os
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from llmbuild import LlmbuildError

INSTALL_HINT = "./scripts/install.sh"


@dataclass(frozen=True)
class QuantParams:
    """The quantization every method is asked for (the recipe's fields), plus run settings."""

    bits: int
    group_size: int  # -1: one group per output channel
    sym: bool
    desc_act: bool
    seed: int
    threads: int


@dataclass(frozen=True)
class Option:
    """One method option: its default, its type, and (optionally) the values it may take."""

    default: Any
    kind: type | tuple[type, ...]
    choices: tuple[Any, ...] = ()


def import_library(method: str, import_name: str, install: str) -> ModuleType:
    """`import_name`, or LlmbuildError naming the pip package and the install script."""
    try:
        return importlib.import_module(import_name)
    except ImportError as exc:
        reason = " ".join(str(exc).split())  # one line, whatever the import machinery said
        raise LlmbuildError(
            f"quantization method {method!r} needs the {import_name!r} library, which cannot be imported "
            f"({reason}); install it with {INSTALL_HINT} (or `{install}`)"
        ) from None


def library_version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout (Python's sys.stdout and file descriptor 1, which is where C
    extensions and loggers holding the original stream write) to stderr until the block ends."""
    sys.stdout.flush()
    saved_fd = os.dup(1)
    saved_stream = sys.stdout
    try:
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = saved_stream
        os.dup2(saved_fd, 1)
        os.close(saved_fd)


@contextlib.contextmanager
def reproducible_torch(seed: int, threads: int) -> Iterator[None]:
    """Seed Python, numpy and torch and pin torch's intra-op threads: the libraries draw random
    numbers (AutoRound's rounding init, sample order) and float sums depend on how work is split
    across threads, so the same seed and thread count give byte-identical checkpoints."""
    import numpy as np
    import torch

    old_threads = torch.get_num_threads()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)

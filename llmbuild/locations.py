"""Where builds live: `build/` under the working directory, or $LLMBUILD_BUILD_DIR. The compiler writes
each recipe's artifacts to <build root>/<recipe>/; the runtime finds a binary there by recipe name."""

from __future__ import annotations

import os
from pathlib import Path

BUILD_DIR_ENV = "LLMBUILD_BUILD_DIR"


def build_root() -> Path:
    return Path(os.environ.get(BUILD_DIR_ENV, "build"))


# `bmodel: false` in the workflow's configuration (or LLMBUILD_BMODEL=0) builds no vendor .bmodel in this run
# (a machine without TPU-MLIR, or a quick run); otherwise each recipe's `bmodel.build` decides.
BMODEL_ENV = "LLMBUILD_BMODEL"


def bmodel_allowed() -> bool:
    return os.environ.get(BMODEL_ENV, "1") != "0"

"""Write a directory all or nothing: a reader never sees a half-written checkpoint."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_directory(out_dir: Path) -> Iterator[Path]:
    """Yield an empty sibling directory; on success it replaces `out_dir`, on failure it vanishes,
    so a reader never sees a half-written directory."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        yield tmp
        # mkdtemp's 0700 (and some writers' 0600) would surprise whoever reads the result.
        os.chmod(tmp, 0o755)
        for path in tmp.rglob("*"):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        old = None
        if out_dir.exists():
            # rename() cannot replace a non-empty directory: move the old one aside first.
            old = tmp.with_suffix(".old")
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

"""A binary file whose sections were all hashed once is not hashed again while it is unchanged.

Opening a container checks every section's sha256 (container.py): for a 7B binary that is 5.6 GB read and
hashed before `llmbuild run` or `chat` can start, seconds every time. After a successful check, a stamp is
left in the user's cache folder (`$XDG_CACHE_HOME/llmbuild/verified`, else `~/.cache/llmbuild/verified`),
named by what identifies this exact file: its path, device, inode, size, modification and change times in
nanoseconds, and its header's checksum. Any write to the file changes its change time (which no user call
can set back), so a changed file is hashed again.

The one gap is the file system's clock: a write within the same tick as the check (a few milliseconds)
could leave both times as they were. As git does for its index, a file changed less than `SETTLE_S` seconds
before its check is not stamped, so it is hashed again the next time too. `LLMBUILD_VERIFIED_CACHE=0` turns
stamps off (every open hashes every section). A cache that cannot be read or written is skipped.

Part of the runtime: stdlib only.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

ENV = "LLMBUILD_VERIFIED_CACHE"
SETTLE_S = 2.0


def _folder() -> Path | None:
    if os.environ.get(ENV) == "0":
        return None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmbuild" / "verified"


def _name(path: Path, st: os.stat_result, header_checksum: int) -> str:
    who = "\0".join(str(x) for x in (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                     st.st_ctime_ns, header_checksum))
    return hashlib.sha256(who.encode()).hexdigest()[:40]


def stamped(path: Path, st: os.stat_result, header_checksum: int) -> bool:
    """Whether this exact file (as `st` describes it) was checked whole before."""
    folder = _folder()
    return folder is not None and (folder / _name(path, st, header_checksum)).is_file()


def stamp(path: Path, st: os.stat_result, header_checksum: int) -> None:
    """Remember that the file `st` describes was checked whole (unless it changed too recently to tell)."""
    folder = _folder()
    settled = time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > SETTLE_S * 1e9
    if folder is None or not settled:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / _name(path, st, header_checksum)).touch()
    except OSError:
        return

"""A bmodel's fixed header and the chip it names, read without the vendor's libraries: the build's combine
and creation-time pin read the same bytes the cmodel runtime checks before a load, and importing this
module loads nothing of the simulator (a compile step's code digest stays apart from the runtime's)."""

from __future__ import annotations

import os

CHIPS = ("bm1684x", "bm1688")

BMODEL_MAGIC = 0xFF55AAEE
BMODEL_HEADER_BYTES = 20  # magic, header size and description size (uint32), data size (uint64), packed
BMODEL_FULL_HEADER = 64  # with the eleven reserved words after them


def bmodel_header(head: bytes) -> tuple[int, int, int] | None:
    """(header size, flatbuffer size, binary size) from a bmodel's first 20 bytes (magic 0xFF55AAEE, then
    those sizes, little-endian: the data's as 64 bits, a 7B's exceeds 4 GiB), or None when they are not a
    bmodel's."""
    if len(head) < BMODEL_HEADER_BYTES:
        return None
    magic, header_size, fb_size = (int.from_bytes(head[k:k + 4], "little") for k in (0, 4, 8))
    binary_size = int.from_bytes(head[12:20], "little")
    if magic != BMODEL_MAGIC or not BMODEL_HEADER_BYTES <= header_size <= 4096 or not 0 < fb_size <= 1 << 26:
        return None
    return header_size, fb_size, binary_size


def bmodel_chip(path: str | os.PathLike[str]) -> str | None:
    """The chip a bmodel was built for ('bm1684x', 'bm1688'), or None when it cannot be told.

    After the header comes a flatbuffer whose `chip` is a length-prefixed, NUL-terminated string; the
    runtime refuses a bmodel of another chip with only a log line, so `load` checks first to say why."""
    try:
        with open(path, "rb") as f:
            header = bmodel_header(f.read(BMODEL_HEADER_BYTES))
            if header is None:
                return None
            f.seek(header[0])
            fb = f.read(header[1])
    except OSError:
        return None
    found = [c for c in CHIPS if (len(c).to_bytes(4, "little") + c.upper().encode() + b"\0") in fb]
    return found[0] if len(found) == 1 else None

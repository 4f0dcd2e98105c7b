"""What llmbuild reads and writes of a `.bmodel` file itself: its header, and its creation time.

A bmodel starts with a 64-byte header (magic 0xFF55AAEE, header size, flatbuffer size, binary size), then
the flatbuffer describing the nets, then the coefficients and instructions. The flatbuffer holds the time
the vendor's tool wrote it, as `ctime()` text: the only part of a static net's bmodel that differs between
two compiles of the same net. The build pins it to the Unix epoch (the reproducible-builds convention), so
the same recipe and inputs give byte-identical binaries; the text keeps its length, so no offset moves.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import BinaryIO

from llmbuild import LlmbuildError
from llmbuild.runtime.bmodel_header import BMODEL_HEADER_BYTES, BMODEL_MAGIC, bmodel_header

PINNED_TIME = b"Thu Jan  1 00:00:00 1970\n"
_CTIME = re.compile(rb"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\n")


def header(data: bytes, origin: str) -> tuple[int, int, int]:
    """(header size, flatbuffer size, binary size); LlmbuildError naming `origin` when it is no bmodel."""
    found = bmodel_header(data[:BMODEL_HEADER_BYTES])
    if found is None or found[0] + found[1] > len(data):
        raise LlmbuildError(f"{origin}: expected a bmodel (magic {BMODEL_MAGIC:#x}, a header and its description "
                            f"within the file's {len(data)} bytes)")
    return found


def read_description(f: BinaryIO, path: Path) -> tuple[int, bytes]:
    """(header size, the flatbuffer description) of the open bmodel `f`, its data left unread (a vocabulary
    net's is a gigabyte); LlmbuildError naming `path` when it is no bmodel or ends early."""
    found = bmodel_header(f.read(BMODEL_HEADER_BYTES))
    if found is None:
        raise LlmbuildError(f"{path}: expected a bmodel (magic {BMODEL_MAGIC:#x})")
    head, flat, _ = found
    f.seek(head)
    description = f.read(flat)
    if len(description) != flat:
        raise LlmbuildError(f"{path}: the bmodel's description ends early")
    return head, description


def pin_creation_time(path: Path) -> None:
    """Rewrite the creation time in `path`'s flatbuffer as the epoch, in place (the description alone is read)."""
    with open(path, "r+b") as f:
        head, description = read_description(f, path)
        found = list(_CTIME.finditer(description))
        if len(found) != 1:
            raise LlmbuildError(f"{path}: expected one creation time in the bmodel's description, found {len(found)}")
        f.seek(head + found[0].start())
        f.write(PINNED_TIME)


def creation_time_span(data: bytes) -> tuple[int, int] | None:
    """Where the creation time text lies (to compare two bmodels apart from it), or None."""
    head, flat, _ = header(data, "<bytes>")
    found = list(_CTIME.finditer(data[head:head + flat]))
    if len(found) != 1:
        return None
    return head + found[0].start(), head + found[0].end()


__all__ = ["PINNED_TIME", "creation_time_span", "header", "pin_creation_time", "read_description"]

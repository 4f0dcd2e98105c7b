"""What llmbuild reads and writes of a `.bmodel` file itself: its header, and its creation time.

A bmodel starts with a 64-byte header (magic 0xFF55AAEE, header size, flatbuffer size, binary size), then
the flatbuffer describing the nets, then the coefficients and instructions. The flatbuffer holds the time
the vendor's tool wrote it, as `ctime()` text: the only part of a static net's bmodel that differs between
two compiles of the same net. The build pins it to the Unix epoch (the reproducible-builds convention), so
the same recipe and inputs give byte-identical binaries; the text keeps its length, so no offset moves.
Apart from that, the vendor's code generator leaves 3 bytes of `lm_head`'s instructions unset (stack contents,
which differ between runs of its own converter too: docs/bmodel.md); `only_unset_bytes` is the rule that
tells two bmodels equal but for them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import BinaryIO

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.runtime.bmodel_header import BMODEL_HEADER_BYTES, BMODEL_MAGIC, bmodel_header

PINNED_TIME = b"Thu Jan  1 00:00:00 1970\n"
_CTIME = re.compile(rb"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\n")


# The most bytes, all within this span, that two compiles of the same net may differ in (lm_head's unset bytes).
UNSET_BYTES = 3


def only_unset_bytes(differing: list[int]) -> bool:
    """Whether the offsets where two same-sized bmodels differ are at most lm_head's unset bytes."""
    return not differing or (len(differing) <= UNSET_BYTES and differing[-1] - differing[0] < UNSET_BYTES)


def differing_offsets(a: Path, b: Path, most: int = UNSET_BYTES + 1) -> list[int] | None:
    """The first `most` offsets where files `a` and `b` differ, read in 16 MiB chunks (a 7B's bmodel is
    5 GB); None when their sizes differ."""
    if a.stat().st_size != b.stat().st_size:
        return None
    found: list[int] = []
    offset = 0
    with a.open("rb") as fa, b.open("rb") as fb:
        while (chunk := fa.read(1 << 24)) and len(found) < most:
            other = fb.read(len(chunk))
            if chunk != other:
                differ = np.flatnonzero(np.frombuffer(chunk, np.uint8) != np.frombuffer(other, np.uint8))
                found += (offset + differ[:most]).tolist()
            offset += len(chunk)
    return found[:most]


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

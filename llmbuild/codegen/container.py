"""The section container shared by per-layer object files (.llmo) and the deployable binary (.llmb).

    offset 0   header      magic "LLMBUILD", u32 version, u32 section count, u64 table offset, u64 0
    ...        sections    each at a 64-byte boundary (the `weights` section at 4096)
    table      entries     per section: name (64 bytes, NUL padded), u64 offset, u64 size, sha256

The table sits at the end so sections can be streamed (a 7B weight image is never held in memory);
the header is patched last. Files are written to a temporary name and renamed into place, so a failed
write leaves no half-written output. See docs/binary-format.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from llmbuild import LlmbuildError

MAGIC = b"LLMBUILD"
VERSION = 1
HEADER = struct.Struct("<8sIIQQ")
ENTRY = struct.Struct("<64sQQ32s")
SECTION_ALIGN = 64
PAGE_ALIGN = 4096


@dataclass(frozen=True)
class SectionEntry:
    name: str
    offset: int
    size: int
    sha256: bytes


def _pad_to(f, boundary: int) -> None:
    pos = f.tell()
    pad = (-pos) % boundary
    if pad:
        f.write(b"\0" * pad)


def write_container(path: Path, sections: Iterable[tuple[str, Iterable[bytes]]]) -> list[SectionEntry]:
    """Write sections given as (name, chunks); returns the table. Atomic: tmp file + rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sections = list(sections)
    for name, _ in sections:
        if len(name.encode()) > 64:
            raise LlmbuildError(f"{path}: section name {name!r} is longer than 64 bytes")
    tmp = path.with_name(path.name + ".tmp")
    entries: list[SectionEntry] = []
    try:
        with open(tmp, "wb") as f:
            f.write(HEADER.pack(MAGIC, VERSION, 0, 0, 0))
            for name, chunks in sections:
                _pad_to(f, PAGE_ALIGN if name == "weights" else SECTION_ALIGN)
                start, digest = f.tell(), hashlib.sha256()
                for chunk in chunks:
                    digest.update(chunk)
                    f.write(chunk)
                entries.append(SectionEntry(name, start, f.tell() - start, digest.digest()))
            _pad_to(f, SECTION_ALIGN)
            table = f.tell()
            for e in entries:
                f.write(ENTRY.pack(e.name.encode(), e.offset, e.size, e.sha256))
            f.seek(0)
            f.write(HEADER.pack(MAGIC, VERSION, len(entries), table, 0))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return entries


class Container:
    """A read-only, memory-mapped view of a container file."""

    def __init__(self, path: Path, verify: bool = True):
        self.path = path
        self._verify = verify
        try:
            self._file = open(path, "rb")
        except OSError as exc:
            raise LlmbuildError(f"{path}: cannot open: {exc.strerror}") from None
        try:
            self._open(path)
        except BaseException:
            self.close()
            raise

    def _open(self, path: Path) -> None:
        size = os.fstat(self._file.fileno()).st_size
        self._map = None
        if size < HEADER.size:
            raise LlmbuildError(f"{path}: not an llmbuild file (too short)")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        magic, version, count, table, _ = HEADER.unpack_from(self._map, 0)
        if magic != MAGIC:
            raise LlmbuildError(f"{path}: not an llmbuild file (bad magic {magic!r})")
        if version != VERSION:
            raise LlmbuildError(f"{path}: format version {version}, this llmbuild reads version {VERSION}")
        if table + count * ENTRY.size > size:
            raise LlmbuildError(f"{path}: truncated (section table past end of file)")
        self.entries: dict[str, SectionEntry] = {}
        for i in range(count):
            raw_name, offset, length, sha = ENTRY.unpack_from(self._map, table + i * ENTRY.size)
            name = raw_name.rstrip(b"\0").decode()
            if offset + length > size:
                raise LlmbuildError(f"{path}: section {name} runs past the end of the file")
            self.entries[name] = SectionEntry(name, offset, length, sha)
        if self._verify:
            self.verify()

    def close(self) -> None:
        # The map stays alive while numpy arrays or memoryviews still point into it; then the GC frees it.
        m = getattr(self, "_map", None)
        if m is not None:
            with contextlib.suppress(BufferError):
                m.close()
        self._file.close()

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def verify(self) -> None:
        # Plain reads, not the map: hashing a 7B binary through its map would leave all 5 GB resident.
        with open(self.path, "rb") as f:
            for e in self.entries.values():
                f.seek(e.offset)
                digest, left = hashlib.sha256(), e.size
                while left:
                    block = f.read(min(left, 16 << 20))
                    if not block:
                        break
                    digest.update(block)
                    left -= len(block)
                if left or digest.digest() != e.sha256:
                    raise LlmbuildError(f"{self.path}: checksum mismatch in section {e.name} (file corrupted)")

    def section(self, name: str) -> memoryview:
        e = self.entries.get(name)
        if e is None:
            raise LlmbuildError(f"{self.path}: missing section {name}")
        return memoryview(self._map)[e.offset : e.offset + e.size]

    def names(self) -> list[str]:
        return list(self.entries)

    def chunks(self, name: str, size: int = 1 << 24) -> Iterator[bytes]:
        view = self.section(name)
        for start in range(0, len(view), size):
            yield bytes(view[start : start + size])

"""The section container shared by per-layer object files (.llmo) and the deployable binary (.llmb).

    offset 0   header      magic "LLMBUILD", u32 version, u32 section count, u64 table offset,
                           u64 checksum of the header and the table
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

from llmbuild import LlmbuildError, one_line
from llmbuild.binary import verified_stamp

MAGIC = b"LLMBUILD"
VERSION = 2  # 2: the header's last field checksums the header and the section table
HEADER = struct.Struct("<8sIIQQ")
MAX_SECTIONS = 1 << 16  # a binary has a few hundred (three nets a layer); more is a corrupt count
ENTRY = struct.Struct("<64sQQ32s")
SECTION_ALIGN = 64
PAGE_ALIGN = 4096


@dataclass(frozen=True)
class FileSpan:
    """A section's chunk given as bytes `begin:end` of a file: the writer hashes them through a memory map
    and copies them inside the kernel (copy_file_range), so a weight image's bytes are never copied
    through the writing process (a 1.5B's 1.6 GB image: 2.8 s instead of 4.4 s for read, hash and write)."""

    path: Path
    begin: int
    end: int


# A file span is hashed through windows of this many bytes, each unmapped before the next: mapping a 7B's
# 1.1 GB lm_head whole would keep all of it resident in the writing process.
_HASH_WINDOW = 64 << 20


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


def write_container(path: Path, sections: Iterable[tuple[str, Iterable[bytes | FileSpan]]]) -> list[SectionEntry]:
    """Write sections given as (name, chunks), each chunk bytes or a FileSpan; returns the table. Atomic:
    tmp file + rename."""
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
                    if isinstance(chunk, FileSpan):
                        _copy_span(chunk, f, digest)
                    else:
                        digest.update(chunk)
                        f.write(chunk)
                entries.append(SectionEntry(name, start, f.tell() - start, digest.digest()))
            _pad_to(f, SECTION_ALIGN)
            table = f.tell()
            for e in entries:
                f.write(ENTRY.pack(e.name.encode(), e.offset, e.size, e.sha256))
            f.seek(0)
            f.write(HEADER.pack(MAGIC, VERSION, len(entries), table, _table_checksum(len(entries), table, entries)))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return entries


def _copy_span(span: FileSpan, out, digest) -> None:
    """Append `span`'s bytes to `out` (at its position) and feed them to `digest`."""
    size = span.end - span.begin
    truncated = f"{span.path}: ends before byte {span.end} (truncated)"
    out.flush()
    with open(span.path, "rb") as src:
        if os.fstat(src.fileno()).st_size < span.end:
            raise LlmbuildError(truncated)
        base = span.begin - span.begin % mmap.ALLOCATIONGRANULARITY
        pos = span.begin
        while pos < span.end:
            length = min(_HASH_WINDOW, span.end - base)
            with (mmap.mmap(src.fileno(), length, access=mmap.ACCESS_READ, offset=base) as window,
                  memoryview(window) as view):
                digest.update(view[pos - base:])
            pos = base = base + length
        written = 0
        try:
            if not hasattr(os, "copy_file_range"):  # Linux only
                raise OSError("copy_file_range is not available")
            while written < size:
                step = os.copy_file_range(src.fileno(), out.fileno(), size - written, span.begin + written)
                if step == 0:  # shortened since the check above
                    raise LlmbuildError(truncated)
                written += step
        except OSError:  # a file system (or kernel) without copy_file_range between these files: read, write
            src.seek(span.begin + written)
            out.seek(0, os.SEEK_END)
            while written < size:
                block = src.read(min(16 << 20, size - written))
                if not block:
                    raise LlmbuildError(truncated) from None
                out.write(block)
                written += len(block)
            out.flush()
    out.seek(0, os.SEEK_END)


def _table_checksum(count: int, table: int, entries: Iterable[SectionEntry]) -> int:
    """The first 8 bytes of the SHA-256 of the header (its checksum field zero) and the section table: a
    flipped bit in a section's name, offset, size or digest is caught before any of them is used."""
    digest = hashlib.sha256(HEADER.pack(MAGIC, VERSION, count, table, 0))
    for e in entries:
        digest.update(ENTRY.pack(e.name.encode(), e.offset, e.size, e.sha256))
    return int.from_bytes(digest.digest()[:8], "little")


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
        self._stat = os.fstat(self._file.fileno())
        size = self._stat.st_size
        self._map = None
        if size < HEADER.size:
            raise LlmbuildError(f"{path}: not an llmbuild file (too short)")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        magic, version, count, table, checksum = HEADER.unpack_from(self._map, 0)
        if magic != MAGIC:
            raise LlmbuildError(f"{path}: not an llmbuild file (bad magic {magic!r})")
        if version != VERSION:
            raise LlmbuildError(f"{path}: format version {version}, this llmbuild reads version {VERSION} "
                                "(rebuild it)")
        if count > MAX_SECTIONS or table < HEADER.size or table + count * ENTRY.size > size:
            raise LlmbuildError(f"{path}: corrupted header (section table of {count} entries at {table}, "
                                f"file of {size} bytes)")
        table_bytes = self._map[table : table + count * ENTRY.size]
        digest = hashlib.sha256(HEADER.pack(MAGIC, VERSION, count, table, 0) + table_bytes)
        if int.from_bytes(digest.digest()[:8], "little") != checksum:
            raise LlmbuildError(f"{path}: checksum mismatch in the header or the section table (file corrupted)")
        self.entries: dict[str, SectionEntry] = {}
        for raw, offset, length, sha in ENTRY.iter_unpack(table_bytes):
            raw = raw.rstrip(b"\0")
            name = raw.decode("utf-8", errors="replace")
            if not raw or not name.isprintable() or name.encode() != raw:
                shown = one_line(raw.decode("utf-8", errors="backslashreplace"))
                raise LlmbuildError(f"{path}: section name '{shown}' is not a printable UTF-8 name")
            if offset < HEADER.size or offset + length > size:
                raise LlmbuildError(f"{path}: section {name} lies outside the file")
            if name in self.entries:
                raise LlmbuildError(f"{path}: section {name} appears twice")
            self.entries[name] = SectionEntry(name, offset, length, sha)
        if self._verify and not verified_stamp.stamped(path, self._stat, checksum):
            self.verify()
            verified_stamp.stamp(path, self._stat, checksum)

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
            raise LlmbuildError(f"{self.path}: missing section {one_line(name)}")
        return memoryview(self._map)[e.offset : e.offset + e.size]

    def names(self) -> list[str]:
        return list(self.entries)

    def chunks(self, name: str, size: int = 1 << 24) -> Iterator[bytes]:
        view = self.section(name)
        for start in range(0, len(view), size):
            yield bytes(view[start : start + size])

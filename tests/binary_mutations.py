"""Mutations of a built binary for the loader's fuzz tests (tests/test_binary_fuzz.py) and the long fuzz
run (benchmarks/fuzz_binary.py): raw ones (bit flips, truncations, byte runs, edits of the header and
the section table) and re-signed ones (a section's bytes changed, then its SHA-256 and the header's
checksum recomputed, as a buggy or hostile writer would)."""

from __future__ import annotations

import hashlib
import struct
import traceback
from pathlib import Path

from llmbuild import LlmbuildError
from llmbuild.binary import container

RAW_KINDS = ("flip", "truncate", "run", "header", "table")


def sections(data: bytes) -> list[tuple[str, int, int]]:
    """(name, offset, size) of every section, from an intact binary."""
    _, _, count, table, _ = container.HEADER.unpack_from(data, 0)
    out = []
    for raw, offset, size, _ in container.ENTRY.iter_unpack(data[table : table + count * container.ENTRY.size]):
        out.append((raw.rstrip(b"\0").decode(), offset, size))
    return out


def raw_mutation(data: bytes, kind: str, at: int, value: int, length: int) -> bytes:
    """`kind` applied at a position derived from `at` (any non-negative int)."""
    out = bytearray(data)
    _, _, count, table, _ = container.HEADER.unpack_from(data, 0)
    if kind == "flip":
        out[at % len(out)] ^= 1 << (value % 8)
    elif kind == "truncate":
        del out[at % len(out) :]
    elif kind == "run":
        start = at % len(out)
        out[start : start + length] = bytes([value % 256]) * len(out[start : start + length])
    elif kind == "header":
        out[at % container.HEADER.size] = value % 256
    elif kind == "table":
        out[table + at % max(1, count * container.ENTRY.size)] = value % 256
    return bytes(out)


def resigned_mutation(data: bytes, section: str, at: int, value: int, length: int) -> bytes:
    """Bytes of `section` overwritten (a run of `length` bytes of `value`, or a flipped bit when length is
    0), the section's SHA-256 and the header checksum recomputed: only the validation can catch it."""
    out = bytearray(data)
    _, version, count, table, _ = container.HEADER.unpack_from(data, 0)
    for i in range(count):
        entry_at = table + i * container.ENTRY.size
        raw, offset, size, _ = container.ENTRY.unpack_from(out, entry_at)
        if raw.rstrip(b"\0").decode() != section or size == 0:
            continue
        start = offset + at % size
        if length == 0:
            out[start] ^= 1 << (value % 8)
        else:
            end = min(offset + size, start + length)
            out[start:end] = bytes([value % 256]) * (end - start)
        digest = hashlib.sha256(out[offset : offset + size]).digest()
        container.ENTRY.pack_into(out, entry_at, raw, offset, size, digest)
    checksum_digest = hashlib.sha256(container.HEADER.pack(container.MAGIC, version, count, table, 0)
                                      + bytes(out[table : table + count * container.ENTRY.size]))
    struct.pack_into("<Q", out, 24, int.from_bytes(checksum_digest.digest()[:8], "little"))
    return bytes(out)


def load_and_run(path: Path) -> str:
    """Everything a user does with a binary: open it, describe it, generate two tokens on the host path.
    Returns "ok" or "LlmbuildError"; any other exception propagates (the defect the fuzz looks for)."""
    from llmbuild.runtime.compiled_model import CompiledModel, load_tokenizer
    from llmbuild.runtime.inspect_binary import inspect_binary

    try:
        inspect_binary(path)
        model = CompiledModel(path, faithful=False)
        load_tokenizer(model)
        model.generate([1, 2, 3], 2, ())
        return "ok"
    except LlmbuildError as exc:
        message = str(exc)
        if "\n" in message or not message.isprintable():
            raise AssertionError(f"message not one printable line: {message!r}") from None
        return "LlmbuildError"


def describe_failure(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()

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


JSON_SECTIONS = ("meta", "plan")
JSON_EDITS = ("type", "bound", "alias", "drop", "swap")
# Values of every JSON type and the bounds a loader must check: a wrong type, a negative, zero, one past
# a 64-bit field, a float where an int belongs, a huge count, an empty or a foreign container.
_ODD_VALUES = (None, True, False, 0, -1, 1, 2**31, 2**63, -(2**63) - 1, 1e308, -0.0, 0.5, "", "x" * 300,
               "layers.0.k", [], [0], [-1, -1], {}, {"address": 0})


def json_leaves(node, path: tuple = ()) -> list[tuple]:
    """Every path into a JSON document (containers and leaves), in document order."""
    out = [path]
    if isinstance(node, dict):
        for key, value in node.items():
            out += json_leaves(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += json_leaves(value, (*path, i))
    return out


def _get(node, path: tuple):
    for key in path:
        node = node[key]
    return node


def _set(node, path: tuple, value) -> None:
    _get(node, path[:-1])[path[-1]] = value


def json_mutation(data: bytes, section: str, edit: str, at: int, other: int, value: int) -> bytes:
    """The binary re-written (every section re-signed, as a writer would) with one field of the JSON
    section `section` (meta or plan) edited: `type` and `bound` put an odd value there (_ODD_VALUES),
    `alias` copies another field's value onto it (two slots at one address, a net pointing at another's
    section, a layer index repeated), `drop` deletes it, `swap` exchanges two fields' values."""
    import json
    import tempfile

    table = sections(data)
    parts = {name: data[offset : offset + size] for name, offset, size in table}
    doc = json.loads(parts[section])
    paths = [p for p in json_leaves(doc) if p]
    target = paths[at % len(paths)]
    source = paths[other % len(paths)]
    if edit in ("type", "bound"):
        _set(doc, target, _ODD_VALUES[value % len(_ODD_VALUES)])
    elif edit == "drop":
        parent = _get(doc, target[:-1])
        del parent[target[-1]]
    elif source[: len(target)] != target and target[: len(source)] != source:  # neither inside the other
        if edit == "alias":
            _set(doc, target, json.loads(json.dumps(_get(doc, source))))
        else:  # swap
            a, b = _get(doc, target), _get(doc, source)
            _set(doc, target, b)
            _set(doc, source, a)
    parts[section] = json.dumps(doc).encode()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.llmb"
        container.write_container(out, [(name, [parts[name]]) for name, _, _ in table])
        return out.read_bytes()


def load_and_run(path: Path) -> str:
    """Everything a user does with a binary: open it, describe it, load its weights, generate two tokens on
    the host path.
    Returns "ok" or "LlmbuildError"; any other exception propagates (the defect the fuzz looks for)."""
    from llmbuild.runtime.compiled_model import CompiledModel, load_tokenizer
    from llmbuild.runtime.inspect_binary import inspect_binary

    try:
        inspect_binary(path)
        model = CompiledModel(path, faithful=False)
        load_tokenizer(model)
        model.load_weights()  # what a Session does when it loads
        model.generate([1, 2, 3], 2, ())
        return "ok"
    except LlmbuildError as exc:
        message = str(exc)
        if "\n" in message or not message.isprintable():
            raise AssertionError(f"message not one printable line: {message!r}") from None
        return "LlmbuildError"


def describe_failure(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()

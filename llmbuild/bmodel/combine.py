"""Combining bmodels as a stream: the nets of several bmodel files in one, never holding their data.

`model_tool --combine` reads every part whole and writes the result from memory: twice the binary at its
peak, 9 GB for a 7B. What a combine does is small (measured against `model_tool` on the shipped recipes,
tests/test_bmodel_build.py): the result's nets are the parts' nets as they are, in order; its model fields
are the first part's, the largest `neuron_size` of them all; every binary range (firmware, coefficients,
command streams) is stored once by content, each at a 4096-byte boundary, in the order the description
names them; the header and description are padded so the data starts at a 4096-byte boundary too.

So this module reads each part's header and flatbuffer description (kilobytes), decides where every range
goes, writes the new description with the vendor's schema (`flat_schema.py`), then copies the ranges from
the parts in chunks. Memory: the descriptions and one chunk.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import flatbuffers

from llmbuild import LlmbuildError
from llmbuild.bmodel.bmodel_file import PINNED_TIME, read_description
from llmbuild.bmodel.flat_schema import SCALARS, Reader, Schema
from llmbuild.runtime.bmodel_header import BMODEL_FULL_HEADER, BMODEL_MAGIC

ALIGN = 4096
CHUNK = 16 << 20


@dataclass
class Part:
    path: Path
    model: dict[str, Any]
    data_start: int  # where its binary ranges begin in the file


def read_part(schema: Schema, path: Path) -> Part:
    with open(path, "rb") as f:
        head, description = read_description(f, path)
    return Part(path, Reader(schema, description).root(), head + len(description))


def _binaries(value: Any) -> Iterator[dict[str, int]]:
    """Every `Binary` (a {start, size} struct) in a model's description, in the order the description names
    them (fields in schema order, depth first)."""
    if isinstance(value, dict):
        if value.keys() == {"start", "size"}:
            yield value
            return
        for v in value.values():
            yield from _binaries(v)
    elif isinstance(value, list):
        for v in value:
            yield from _binaries(v)


def combine_stream(schema: Schema, parts: list[Path], output: Path) -> Path:
    """The nets of `parts` in one bmodel at `output` (written to a temporary name, then renamed)."""
    if not parts:
        raise LlmbuildError("bmodel combine: no parts")
    loaded = [read_part(schema, p) for p in parts]
    first = loaded[0].model
    for part in loaded[1:]:
        for key in ("type", "version", "chip", "device_num"):
            if part.model.get(key) != first.get(key):
                raise LlmbuildError(f"{part.path}: {key} {part.model.get(key)!r} differs from {parts[0].name}'s "
                                    f"{first.get(key)!r}: bmodels of one toolchain and chip combine")
    names = [n["name"] for p in loaded for n in p.model["net"]]
    if len(set(names)) != len(names):
        raise LlmbuildError(f"bmodel combine: a net name occurs twice among {', '.join(p.name for p in parts)}")

    model = {k: v for k, v in first.items() if k != "net"}
    model["time"] = PINNED_TIME.decode()
    model["neuron_size"] = max(p.model.get("neuron_size", 0) for p in loaded)

    # Where each range goes: by content, first seen first. The firmware and any other model-level range
    # come from the first part; each part's nets bring their own.
    layout: dict[tuple[str, int], int] = {}
    copies: list[tuple[Path, int, int, int]] = []  # (file, offset in it, size, offset in the output's data)
    end = 0
    owners = [(loaded[0], model), *((p, n) for p in loaded for n in p.model["net"])]
    digests: dict[tuple[Path, int, int], str] = {}
    for index, (part, value) in enumerate(owners):
        for binary in _binaries(value):
            start, size = binary["start"], binary["size"]
            if size == 0:
                # No data: a net's empty range points at the current end, as the vendor's tool writes it; the
                # model's own (no CPU module, no backend library) keep the first part's.
                binary["start"] = start if index == 0 else end
                continue
            where = (part.path, part.data_start + start, size)
            if where not in digests:
                digests[where] = _digest(*where)
            key = (digests[where], size)
            if key not in layout:
                layout[key] = end
                copies.append((*where, end))
                end = _aligned(end + size)
            binary["start"] = layout[key]

    model["net"] = [n for p in loaded for n in p.model["net"]]
    flat = _build(schema, model)
    flat_size = _aligned(BMODEL_FULL_HEADER + len(flat)) - BMODEL_FULL_HEADER
    head = struct.pack("<IIIQ", BMODEL_MAGIC, BMODEL_FULL_HEADER, flat_size, end)
    head += bytes(BMODEL_FULL_HEADER - len(head))
    partial = output.with_name(output.name + ".partial")
    try:
        with open(partial, "wb") as out:
            out.write(head + flat + bytes(flat_size - len(flat)))
            for path, offset, size, at in copies:
                _copy(out, path, offset, size, BMODEL_FULL_HEADER + flat_size + at)
            out.truncate(BMODEL_FULL_HEADER + flat_size + end)
        os.replace(partial, output)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return output


def content_view(schema: Schema, path: Path, nets: Collection[str] | None = None) -> dict[str, Any]:
    """A bmodel's description with each binary range replaced by its size and the sha256 of its bytes: equal
    for two files exactly when they hold the same nets, fields and data, wherever their builders put them.
    `nets`: only these nets' descriptions (and data) are read; the others are left out."""
    part = read_part(schema, path)
    if nets is not None:
        part.model["net"] = [n for n in part.model.get("net") or [] if n["name"] in nets]
    digests: dict[tuple[int, int], str] = {}  # a layer's weights are one range its nets share: read once

    def view(value: Any) -> Any:
        if isinstance(value, dict):
            if value.keys() == {"start", "size"}:
                at = (value["start"], value["size"])
                if at not in digests:
                    digests[at] = _digest(path, part.data_start + value["start"], value["size"])
                return {"size": value["size"], "sha256": digests[at]}
            return {k: view(v) for k, v in value.items()}
        if isinstance(value, list):
            return [view(v) for v in value]
        return value

    return view(part.model)


def net_views(schema: Schema, path: Path, only: Collection[str] | None = None) -> dict[str, dict[str, Any]]:
    """Each net of a bmodel by name (`only` these), as `content_view` shows it: what `net_digest` and
    `coeff_memories` read, so a net's data is hashed once for both."""
    return {net["name"]: net for net in content_view(schema, path, only).get("net") or []}


def net_digest(view: dict[str, Any]) -> str:
    """The sha256 of a net's description with its data ranges as their contents' digests. A net combined
    into another file keeps its digest (its data moves, its bytes do not)."""
    return hashlib.sha256(json.dumps(view, sort_keys=True).encode()).hexdigest()


def net_digests(schema: Schema, path: Path) -> dict[str, str]:
    """Each net of a bmodel by name: its `net_digest`."""
    return {name: net_digest(view) for name, view in net_views(schema, path).items()}


def coeff_memories(view: dict[str, Any]) -> list[dict[str, Any]]:
    """The weights (coefficient memory) of a net, per stage: its device address, the vendor's check code, and
    its bytes' size and sha256."""
    return [stage["coeff_mem"] for stage in view["parameter"]]


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _digest(path: Path, offset: int, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        left = size
        while left:
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                raise LlmbuildError(f"{path}: a binary range ends past the file's end")
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def _copy(out: BinaryIO, path: Path, offset: int, size: int, at: int) -> None:
    out.seek(at)
    with open(path, "rb") as f:
        f.seek(offset)
        left = size
        while left:
            chunk = f.read(min(CHUNK, left))
            out.write(chunk)
            left -= len(chunk)


# ---------------------------------------------------------------------------------------------------------
# Writing a description back: the schema-driven inverse of flat_schema.Reader.

_PREPEND = {"?": "Bool", "b": "Int8", "B": "Uint8", "h": "Int16", "H": "Uint16", "i": "Int32", "I": "Uint32",
            "q": "Int64", "Q": "Uint64", "f": "Float32", "d": "Float64"}


def _build(schema: Schema, model: dict[str, Any]) -> bytes:
    builder = flatbuffers.Builder(1 << 16)
    builder.ForceDefaults(True)  # a field the parts carry is written even where it equals its default
    root = _table(builder, schema, schema.root, model)
    builder.Finish(root)
    return bytes(builder.Output())


def _table(b: flatbuffers.Builder, schema: Schema, name: str, value: dict[str, Any]) -> int:
    fields = [f for f in schema.tables[name] if f.name in value]
    offsets: dict[str, int] = {}
    for f in fields:  # children first: a table's own fields are written between StartObject and EndObject
        v = value[f.name]
        if f.is_vector:
            offsets[f.name] = _vector(b, schema, f.element, v)
        elif f.type == "string":
            offsets[f.name] = b.CreateString(v)
        elif f.type in schema.tables:
            offsets[f.name] = _table(b, schema, f.type, v)
    b.StartObject(max((f.slot for f in schema.tables[name]), default=-1) + 1)
    for f in sorted(reversed(fields), key=lambda f: -_width(schema, f)):
        v = value[f.name]
        if f.name in offsets:
            b.PrependUOffsetTRelativeSlot(f.slot, offsets[f.name], 0)
        elif f.type in schema.structs:
            _struct(b, schema, f.type, v)
            b.PrependStructSlot(f.slot, b.Offset(), 0)
        else:
            getattr(b, f"Prepend{_PREPEND[SCALARS[f.type]]}Slot")(f.slot, v, 0)
    return b.EndObject()


def _width(schema: Schema, f) -> int:
    """The size flatc's generated code sorts a table's fields by (largest first; offsets and structs as 4)."""
    if f.is_vector or f.type == "string" or f.type in schema.tables or f.type in schema.structs:
        return 4
    return struct.calcsize(SCALARS[f.type])


def _vector(b: flatbuffers.Builder, schema: Schema, element: str, items: list[Any]) -> int:
    if element in SCALARS:
        width = struct.calcsize(SCALARS[element])
        b.StartVector(width, len(items), width)
        for v in reversed(items):
            getattr(b, f"Prepend{_PREPEND[SCALARS[element]]}")(v)
        return b.EndVector()
    if element in schema.structs:
        size, align = schema.struct_size(element)
        b.StartVector(size, len(items), align)
        for v in reversed(items):
            _struct(b, schema, element, v)
        return b.EndVector()
    children = [b.CreateString(v) if element == "string" else _table(b, schema, element, v) for v in items]
    b.StartVector(4, len(children), 4)
    for child in reversed(children):
        b.PrependUOffsetTRelative(child)
    return b.EndVector()


def _struct(b: flatbuffers.Builder, schema: Schema, name: str, value: dict[str, int]) -> None:
    size, align = schema.struct_size(name)
    b.Prep(align, size)
    position = size
    for offset, width, f in reversed(schema.struct_layout(name)):
        b.Pad(position - offset - width)
        getattr(b, f"Prepend{_PREPEND[SCALARS[f.type]]}")(value[f.name])
        position = offset
    b.Pad(position)

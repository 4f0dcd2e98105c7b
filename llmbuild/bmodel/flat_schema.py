"""The bmodel's flatbuffer schema, read from the vendor's own `bmodel.fbs`, and a reader over it.

TPU-MLIR ships the schema its tools write (`tpu_mlir/include/tpu_mlir/Builder/BM168x/bmodel.fbs`); llmbuild
reads it rather than restating it, so the reader follows the installed toolchain. The grammar used there is
small: `struct` and `table` declarations, `name:type` fields with optional `(id: N, required)` attributes and
`= default` values, and comments.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError

# Scalar types: struct format and size.
SCALARS = {"bool": "?", "byte": "b", "ubyte": "B", "int8": "b", "uint8": "B", "short": "h", "ushort": "H",
           "int16": "h", "uint16": "H", "int": "i", "uint": "I", "int32": "i", "uint32": "I", "float": "f",
           "float32": "f", "long": "q", "ulong": "Q", "int64": "q", "uint64": "Q", "double": "d", "float64": "d"}


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # a scalar, `string`, a struct or table name, or `[T]`
    slot: int  # its id: the vtable slot

    @property
    def element(self) -> str:
        return self.type[1:-1] if self.is_vector else self.type

    @property
    def is_vector(self) -> bool:
        return self.type.startswith("[")


@dataclass
class Schema:
    structs: dict[str, list[Field]] = field(default_factory=dict)
    tables: dict[str, list[Field]] = field(default_factory=dict)
    root: str = ""

    def struct_layout(self, name: str) -> list[tuple[int, int, Field]]:
        """(offset, width, field) of each field of a struct of scalars, as flatbuffers lays them out (each
        field aligned to its own width)."""
        layout, offset = [], 0
        for f in self.structs[name]:
            width = struct.calcsize(SCALARS[f.type])
            offset = (offset + width - 1) // width * width
            layout.append((offset, width, f))
            offset += width
        return layout

    def struct_size(self, name: str) -> tuple[int, int]:
        """(size, alignment) of a struct: its last field's end, rounded up to its widest field."""
        layout = self.struct_layout(name)
        end = max((offset + width for offset, width, _ in layout), default=0)
        align = max((width for _, width, _ in layout), default=1)
        return (end + align - 1) // align * align, align


_DECL = re.compile(r"\b(struct|table)\s+(\w+)\s*\{([^}]*)\}", re.S)
_FIELD = re.compile(r"(\w+)\s*:\s*(\[?\w+\]?)\s*(?:=\s*[^;(]+)?(?:\(([^)]*)\))?\s*;")


def parse_schema(text: str) -> Schema:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    schema = Schema()
    for kind, name, body in _DECL.findall(text):
        fields = []
        for index, (fname, ftype, attrs) in enumerate(_FIELD.findall(body)):
            found = re.search(r"\bid\s*:\s*(\d+)", attrs or "")
            fields.append(Field(fname, ftype, int(found.group(1)) if found else index))
        (schema.structs if kind == "struct" else schema.tables)[name] = fields
    root = re.search(r"root_type\s+(\w+)\s*;", text)
    if root is None or root.group(1) not in schema.tables:
        raise LlmbuildError("bmodel.fbs: expected a root_type naming one of its tables")
    schema.root = root.group(1)
    return schema


def load_schema(path: Path) -> Schema:
    return parse_schema(path.read_text(encoding="utf-8"))


class Reader:
    """Tables of one flatbuffer as plain values: a table is a dict of its present fields, a struct a dict of
    its fields, a vector a list, a string a str."""

    def __init__(self, schema: Schema, buf: bytes) -> None:
        self.schema, self.buf = schema, buf

    def _u32(self, pos: int) -> int:
        return struct.unpack_from("<I", self.buf, pos)[0]

    def root(self) -> dict[str, Any]:
        return self.table(self.schema.root, self._u32(0))

    def field_positions(self, table: str, pos: int) -> dict[str, int]:
        """Where each present field of the table at `pos` starts."""
        vtable = pos - struct.unpack_from("<i", self.buf, pos)[0]
        vt_size = struct.unpack_from("<H", self.buf, vtable)[0]
        out = {}
        for f in self.schema.tables[table]:
            at = 4 + 2 * f.slot
            if at + 2 <= vt_size:
                offset = struct.unpack_from("<H", self.buf, vtable + at)[0]
                if offset:
                    out[f.name] = pos + offset
        return out

    def table(self, name: str, pos: int) -> dict[str, Any]:
        fields = {f.name: f for f in self.schema.tables[name]}
        return {key: self.value(fields[key], at) for key, at in self.field_positions(name, pos).items()}

    def value(self, f: Field, at: int) -> Any:
        if f.is_vector:
            start = at + self._u32(at)
            count = self._u32(start)
            return [self.element(f.element, start + 4, i) for i in range(count)]
        return self.element(f.type, at, 0, inline=True)

    def element(self, kind: str, base: int, index: int, inline: bool = False) -> Any:
        if kind in SCALARS:
            width = struct.calcsize(SCALARS[kind])
            return struct.unpack_from("<" + SCALARS[kind], self.buf, base + index * width)[0]
        if kind in self.schema.structs:
            size, _ = self.schema.struct_size(kind)
            return self.struct(kind, base + index * size)
        at = base + 4 * index
        target = at + self._u32(at)
        if kind == "string":
            length = self._u32(target)
            return bytes(self.buf[target + 4: target + 4 + length]).decode("utf-8", "replace")
        return self.table(kind, target)

    def struct(self, name: str, pos: int) -> dict[str, int]:
        return {f.name: struct.unpack_from("<" + SCALARS[f.type], self.buf, pos + offset)[0]
                for offset, _, f in self.schema.struct_layout(name)}

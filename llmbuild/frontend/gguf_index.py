"""A fast reader of a GGUF file's header: metadata and the tensor index, data left memory-mapped.

`gguf.GGUFReader` builds a numpy view per metadata item; for a 49k-token vocabulary that takes 6-13 s,
paid again by every per-layer build job. This reader walks the same header with `struct` and gives each
tensor as a memory-mapped view, to be dequantized with `gguf.quants.dequantize`. Arrays of strings (the
vocabulary and the merges, most of a header) are only stepped over, and decoded when first read: only the
step that writes the tokenizer files reads them, and SmolLM2's header went from 0.23 s to 0.03 s for
every other job.
Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (version 2 and 3).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError

MAGIC = b"GGUF"
# GGUF metadata value types -> struct format (8: string, 9: array are handled separately)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # numpy order (GGUF stores dims fastest-first; reversed here)
    tensor_type: Any  # gguf.GGMLQuantizationType
    data: np.ndarray  # raw bytes (uint8) viewed from the map, in the layout dequantize expects
    offset: int = 0  # where the data starts in the file, in bytes


_LENGTH = struct.Struct("<Q")


class LazyStrings(Sequence[str]):
    """A metadata array of strings, decoded on first use (see the module's docstring)."""

    def __init__(self, buf: mmap.mmap, start: int, count: int) -> None:
        self._buf, self._start, self._count = buf, start, count
        self._values: list[str] | None = None

    def _decoded(self) -> list[str]:
        if self._values is None:
            values, pos = [], self._start
            for _ in range(self._count):
                (n,) = _LENGTH.unpack_from(self._buf, pos)
                values.append(self._buf[pos + 8 : pos + 8 + n].decode("utf-8", errors="replace"))
                pos += 8 + n
            self._values = values
        return self._values

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):  # type: ignore[override]  # int or slice, as a list
        return self._decoded()[i]

    def __iter__(self):
        return iter(self._decoded())

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return f"LazyStrings({self._count} strings)"


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str) -> Any:
        s = struct.Struct("<" + fmt)
        if self.pos + s.size > len(self.buf):
            raise LlmbuildError(f"{self.path}: truncated GGUF header")
        (value,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return value

    def string(self) -> str:
        n = self.take("Q")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> LazyStrings:
        """Step over `count` strings (each a u64 length and its bytes); they are decoded when first read."""
        start, pos, buf = self.pos, self.pos, self.buf
        try:
            for _ in range(count):
                pos += 8 + _LENGTH.unpack_from(buf, pos)[0]
        except struct.error:
            pos = len(buf) + 1
        if pos > len(buf):
            raise LlmbuildError(f"{self.path}: truncated GGUF header")
        self.pos = pos
        return LazyStrings(buf, start, count)

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, count = self.take("I"), self.take("Q")
            if itype in _SCALARS:
                s = struct.Struct(f"<{count}{_SCALARS[itype]}")
                values = list(s.unpack_from(self.buf, self.pos))
                self.pos += s.size
                return values
            if itype == _STRING:
                return self.skip_strings(count)
            return [self.value(itype) for _ in range(count)]
        raise LlmbuildError(f"{self.path}: unknown GGUF metadata type {vtype}")


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, GGUFTensor]]:
    """(metadata, tensors by GGUF name). Raises LlmbuildError for files that are not GGUF."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    _PLAIN = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}

    try:
        f = open(path, "rb")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:
        raise LlmbuildError(f"{path}: cannot read GGUF file: {exc}") from None
    c = _Cursor(buf, path)
    if buf[:4] != MAGIC:
        raise LlmbuildError(f"{path}: not a GGUF file (bad magic)")
    c.pos = 4
    version = c.take("I")
    if version not in (2, 3):
        raise LlmbuildError(f"{path}: GGUF version {version} is not supported (expected 2 or 3)")
    n_tensors, n_kv = c.take("Q"), c.take("Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string()
        metadata[key] = c.value(c.take("I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        dims = [c.take("Q") for _ in range(c.take("I"))]
        qtype, offset = c.take("I"), c.take("Q")
        infos.append((name, dims, qtype, offset))
    alignment = int(metadata.get("general.alignment", 32))
    data_start = (c.pos + alignment - 1) // alignment * alignment
    whole = np.frombuffer(buf, dtype=np.uint8)
    tensors: dict[str, GGUFTensor] = {}
    for name, dims, qtype_id, offset in infos:
        try:
            qtype = GGMLQuantizationType(qtype_id)
        except ValueError:
            raise LlmbuildError(f"{path}: tensor {name}: unknown GGML type {qtype_id}") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        count = int(np.prod(dims)) if dims else 1
        if dims[0] % block:
            raise LlmbuildError(f"{path}: tensor {name}: row of {dims[0]} is not a multiple of {block}")
        nbytes = count // block * type_size
        start = data_start + offset
        if start + nbytes > len(buf):
            raise LlmbuildError(f"{path}: tensor {name} runs past the end of the file")
        shape = tuple(reversed(dims))
        row_bytes = dims[0] // block * type_size
        raw = whole[start : start + nbytes].reshape(*shape[:-1], row_bytes)
        if qtype in _PLAIN:  # unquantized types are read as their element type, as GGUFReader does
            raw = raw.view(_PLAIN[qtype]).reshape(shape)
        tensors[name] = GGUFTensor(name, shape, qtype, raw, start)
    return metadata, tensors

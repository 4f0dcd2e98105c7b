"""Raw tensor access for quantized checkpoints: integer dtypes kept as they are.

`llmbuild.frontend.hf` reads float tensors only (and widens them to f32); a quantized checkpoint also
holds packed int32 words, int64 shapes and uint8/int8 zero points, and the fp16 scales must stay
exact. So this reader parses the safetensors header itself and returns each tensor in its stored dtype
(bf16, which numpy lacks, widened to f32 bit-exactly), one tensor at a time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.frontend.safetensors_header import read_header

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "u1",
}  # fmt: skip


class TensorReader(Protocol):
    """What the format readers need: names, shapes without reading, and one tensor at a time."""

    origin: str  # what errors name: a file, or a description for in-memory tensors

    def __contains__(self, name: object) -> bool: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def read(self, name: str) -> np.ndarray: ...


class DictTensors:
    """A TensorReader over arrays in memory (tests, or tensors already loaded)."""

    def __init__(self, tensors: Mapping[str, np.ndarray], origin: str = "<tensors>") -> None:
        self._tensors = dict(tensors)
        self.origin = origin

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def names(self) -> list[str]:
        return list(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self._tensors[name].shape)

    def read(self, name: str) -> np.ndarray:
        return np.asarray(self._tensors[name])


@dataclass(frozen=True)
class _Entry:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


class SafetensorsDir:
    """A TensorReader over model.safetensors or a sharded index in `directory` (HF tensor names)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        index = self.directory / INDEX_FILE
        single = self.directory / SINGLE_FILE
        self._entries: dict[str, _Entry] = {}
        if index.is_file():
            self.origin = str(index)
            weight_map = _read_json(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise LlmbuildError(f"{index}: missing field 'weight_map'")
            for shard in sorted(set(weight_map.values())):
                for name, entry in _read_header(self.directory / shard).items():
                    if weight_map.get(name) == shard:
                        self._entries[name] = entry
        elif single.is_file():
            self.origin = str(single)
            self._entries = _read_header(single)
        else:
            raise LlmbuildError(f"{self.directory}: no {SINGLE_FILE} or {INDEX_FILE}")
        self._maps: dict[Path, np.memmap] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name].shape

    def dtype(self, name: str) -> str:
        """The safetensors dtype as written: "I32", "F16", "BF16", ..."""
        return self._entries[name].dtype

    def read(self, name: str) -> np.ndarray:
        entry = self._entries.get(name)
        if entry is None:
            raise LlmbuildError(f"{self.origin}: missing tensor {name!r}")
        mm = self._maps.get(entry.file)
        if mm is None:
            mm = self._maps[entry.file] = np.memmap(entry.file, dtype=np.uint8, mode="r")
        words = mm[entry.begin : entry.end].view(_DTYPES[entry.dtype]).reshape(entry.shape)
        if entry.dtype == "BF16":
            return (words.astype(np.uint32) << 16).view(np.float32)  # bf16 is the top half of an f32
        return np.array(words)  # a copy, never a view into the map


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LlmbuildError(f"{path}: cannot read JSON: {exc}") from None
    if not isinstance(data, dict):
        raise LlmbuildError(f"{path}: expected a JSON object")
    return data


def _read_header(path: Path) -> dict[str, _Entry]:
    """Parse a safetensors header (see frontend/safetensors_header.py) into this reader's entries."""
    return {name: _Entry(path, *record) for name, record in read_header(path, _DTYPES).items()}

"""Hugging Face checkpoint directories: config.json plus one or sharded safetensors files.

We parse the safetensors header ourselves and memory-map the data, so each `tensor()` call reads
exactly one tensor, and bf16 (which numpy has no dtype for) is widened to float32 bit-exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.families.layout import expected_shapes
from llmbuild.families.registry import (
    family_for_hf_model_type,
    family_part,
    get_family,
    text_family_for_hf_model_type,
    text_tensor_prefixes,
    vision_family_for_hf_model_type,
)
from llmbuild.families.spec import ModelSpec
from llmbuild.frontend.safetensors_header import read_header
from llmbuild.json_file import read_json
from llmbuild.numerics.formats import bf16_bits_to_f32
from llmbuild.numerics.stored import RowReader

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# safetensors dtype -> numpy little-endian dtype; BF16 is read as raw 16-bit words. Integer tensors are
# the packed levels of a quantized checkpoint: listed so the header parses, read by llmbuild.quant.
_FLOAT_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}
_DTYPES = _FLOAT_DTYPES | {"I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1"}


@dataclass(frozen=True)
class _Entry:
    file: Path
    hf_name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offsets in `file`
    end: int


def has_hf_weights(directory: Path) -> bool:
    return (directory / SINGLE_FILE).is_file() or (directory / INDEX_FILE).is_file()


def weights_listing(directory: Path) -> Path:
    """The file that lists a checkpoint directory's tensors: its index, else its one safetensors file."""
    return directory / INDEX_FILE if (directory / INDEX_FILE).is_file() else directory / SINGLE_FILE


# The stored prefix of the decoder's tensors -> that of lm_head, to name a missing tensor as the file would:
# `model.` for a text model, and each family's other layouts (its folder's `TEXT_PREFIXES`).
def _head_prefix(prefix: str) -> str:
    return text_tensor_prefixes().get(prefix, "")


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's fields of a config.json: a vision-language family's reading of its own (its
    folder's `family.text_config`: InternVL's `text_config` in either layout, MiniCPM-V's top level), or a
    text family's whose published whole model nests its language part (Qwen3.5's); any other config as it
    is (the same object: a vision-language model of no registered family is then refused by its model_type)."""
    family = vision_family_for_hf_model_type(cfg.get("model_type"))
    if family is not None:
        return family_part(family, "family").text_config(cfg)
    text = text_family_for_hf_model_type(cfg.get("model_type"))
    if text is not None:
        own = get_family(text).text_config(cfg)
        return cfg if own == cfg else own
    return cfg


def canonical_name(hf_name: str) -> str:
    """A language model tensor's name without its checkpoint prefix (`model.`, or a vision-language model's
    decoder or lm_head prefix: the registered families' `TEXT_PREFIXES`)."""
    for prefix in _stored_prefixes():
        if hf_name.startswith(prefix):
            return hf_name[len(prefix):]
    return hf_name.removeprefix("model.")


@cache
def _stored_prefixes() -> tuple[str, ...]:
    """The decoder and lm_head prefixes of every registered layout, longest first (`language_model.model.`
    is tried before `language_model.`, which names the original InternVL's lm_head)."""
    found = {p for pair in text_tensor_prefixes().items() for p in pair if p}
    return tuple(sorted(found, key=lambda p: (-len(p), p)))


class HFSource:
    """A TensorSource over a HF checkpoint directory (spec from config.json via its model_type)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        config_path = self.directory / "config.json"
        if not config_path.is_file():
            raise LlmbuildError(f"{config_path}: missing; not a Hugging Face checkpoint directory")
        cfg = text_config(read_json(config_path))
        model_type = cfg.get("model_type")
        if not isinstance(model_type, str):
            raise LlmbuildError(f"{config_path}: missing field 'model_type'")
        self.architecture = get_family(family_for_hf_model_type(model_type, str(config_path)))
        # generate() stops on generation_config.json's ids, which may list more than config.json's.
        generation_path = self.directory / "generation_config.json"
        if generation_path.is_file():
            generation = read_json(generation_path)
            cfg = cfg | {k: generation[k] for k in ("bos_token_id", "eos_token_id") if k in generation}
        self.spec: ModelSpec = self.architecture.spec_from_hf_config(cfg, origin=str(config_path))
        self._shapes = expected_shapes(self.spec)
        self._index_path, self._entries = _read_index(self.directory)
        self._maps: dict[Path, np.memmap] = {}

    def names(self) -> list[str]:
        return [name for name in self._shapes if name in self._entries]

    def expected_names(self) -> list[str]:
        """Every tensor config.json implies for this architecture."""
        return list(self._shapes)

    def check_entry(self, name: str) -> None:
        """Present, with the expected shape and a float dtype: one LlmbuildError naming file and tensor."""
        self._entry(name)

    def entries(self) -> list[_Entry]:
        """Every tensor of the checkpoint's files, as listed by their headers."""
        return list(self._entries.values())

    def tensor(self, name: str) -> np.ndarray:
        entry = self._entry(name)
        array = self._read(entry)
        return self.architecture.transform_hf_tensor(name, array, self.spec)

    def reader(self, name: str) -> RowReader:
        """`name` read by row blocks, decoded to float32 as they are read: a 7B vocabulary table (2 GB in
        float32) is never decoded whole. For tensors the family's hook leaves as they are (all of ours)."""
        return _EntryRows(self, self._entry(name))

    def _entry(self, name: str) -> _Entry:
        expected = self._shapes.get(name)
        if expected is None:
            raise LlmbuildError(f"{self.directory}: {name!r} is not a tensor of this {self.spec.architecture} model")
        entry = self._entries.get(name)
        if entry is None:
            hf_name = self._stored_name(name)
            raise LlmbuildError(f"{self._index_path}: missing tensor {hf_name!r} (config.json needs it)")
        if entry.shape != expected:
            raise LlmbuildError(
                f"{entry.file}: tensor {entry.hf_name!r} has shape {list(entry.shape)}, "
                f"expected {list(expected)} from config.json"
            )
        if entry.dtype not in _FLOAT_DTYPES:
            raise LlmbuildError(f"{entry.file}: tensor {entry.hf_name!r} has dtype {entry.dtype}, expected a float "
                                "type (a quantized projection is read by the quantization import)")
        return entry

    def _stored_name(self, name: str) -> str:
        """`name` as this checkpoint's files would name it (`llm.model.` for MiniCPM-V, ...): the prefix its
        other decoder tensors are stored under."""
        prefix = "model."
        for canonical, entry in self._entries.items():
            if canonical in self._shapes and not canonical.startswith("lm_head."):
                prefix = entry.hf_name[: len(entry.hf_name) - len(canonical)]
                break
        if name.startswith("lm_head."):
            return _head_prefix(prefix) + name
        return prefix + name

    def _words(self, entry: _Entry) -> np.ndarray:
        mm = self._maps.get(entry.file)
        if mm is None:
            mm = self._maps[entry.file] = np.memmap(entry.file, dtype=np.uint8, mode="r")
        return mm[entry.begin : entry.end].view(_DTYPES[entry.dtype]).reshape(entry.shape)

    def _read(self, entry: _Entry, lo: int = 0, hi: int | None = None) -> np.ndarray:
        return _as_f32(self._words(entry)[lo:hi], entry.dtype)  # always a copy, never a view into the map


class _EntryRows(RowReader):
    def __init__(self, source: HFSource, entry: _Entry):
        self.source, self.entry, self.shape = source, entry, tuple(entry.shape)

    def rows(self, lo: int, hi: int) -> np.ndarray:
        return _as_f32(self._stored(lo, hi), self.entry.dtype)

    def stored_rows(self, lo: int, hi: int, dtype: str) -> np.ndarray | None:
        # The words as they are: decoding a bf16 value to float32 and rounding it back to bf16 gives its bits
        # again (prepare refused non-finite values, the one case where rounding rewrites them).
        return self._stored(lo, hi) if (self.entry.dtype, dtype) == ("BF16", "bf16") else None

    def _stored(self, lo: int, hi: int) -> np.ndarray:
        # Plain reads, not the memory map: streaming a 2 GB table through a map keeps it all resident.
        hi = min(hi, self.shape[0])  # like slicing an array: a block may end past the last row
        dtype = np.dtype(_DTYPES[self.entry.dtype])
        row = dtype.itemsize * int(np.prod(self.shape[1:]))
        with open(self.entry.file, "rb") as f:
            f.seek(self.entry.begin + lo * row)
            return np.frombuffer(f.read((hi - lo) * row), dtype=dtype).reshape(hi - lo, *self.shape[1:])

    def take(self, index: np.ndarray) -> np.ndarray:
        index = np.asarray(index, dtype=np.int64)
        values = _as_f32(self.source._words(self.entry)[index.reshape(-1)], self.entry.dtype)
        return values.reshape(*index.shape, *self.shape[1:])


def _as_f32(words: np.ndarray, dtype: str) -> np.ndarray:
    """A safetensors entry's stored words as float32, a new array: bf16 is the top half of a float32, shifted
    back into place; other types converted."""
    return bf16_bits_to_f32(words) if dtype == "BF16" else words.astype(np.float32)


def _read_index(directory: Path) -> tuple[Path, dict[str, _Entry]]:
    """(the file to name in errors, canonical name -> entry) for one file or a sharded index."""
    index_path = directory / INDEX_FILE
    if index_path.is_file():
        weight_map = read_json(index_path).get("weight_map")
        if not isinstance(weight_map, dict):
            raise LlmbuildError(f"{index_path}: missing field 'weight_map'")
        entries: dict[str, _Entry] = {}
        for shard in sorted(set(weight_map.values())):
            header = _read_header(directory / shard)
            for hf_name, entry in header.items():
                if weight_map.get(hf_name) == shard:
                    entries[canonical_name(hf_name)] = entry
        return index_path, entries
    single = directory / SINGLE_FILE
    if single.is_file():
        return single, {canonical_name(k): v for k, v in _read_header(single).items()}
    raise LlmbuildError(f"{directory}: no {SINGLE_FILE} or {INDEX_FILE}")


def _read_header(path: Path) -> dict[str, _Entry]:
    """Parse a safetensors header (see safetensors_header.py) into this reader's entries."""
    records = read_header(path, _DTYPES, f" (listed in {INDEX_FILE})")
    return {name: _Entry(path, name, *record) for name, record in records.items()}

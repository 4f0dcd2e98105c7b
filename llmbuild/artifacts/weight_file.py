"""One object's weights in the device's storage format: a safetensors file beside the object.

The layer (or head) job writes it, the checks read it memory-mapped, the link step copies it into the
binary at the planned addresses. It is the only copy of the weights before the binary exists, and the
rules mark it temporary: once linked, the weights live in the binary alone (a build directory holds a
7B model's weights once, not three times). It stays a file a person can open: bf16 tensors are `BF16`,
4-bit levels the packed bytes (`U8`, two per byte along K), each tensor's device address in the
metadata.

Tensors are written in address order, one at a time; a tensor given as a function of a row range is
written in row blocks (a 7B vocabulary table is never held whole in float32).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.binary.memory_map import MemoryPlan, Slot
from llmbuild.frontend.safetensors_header import read_header
from llmbuild.numerics.formats import STORAGE, encode
from llmbuild.numerics.stored import RowReader
from llmbuild.runtime.weight_image import SlotImage

SAFETENSORS_DTYPE = {"f32": "F32", "f16": "F16", "bf16": "BF16", "i32": "I32", "u8": "U8"}
_NUMPY_OF = {st: STORAGE[ours][1].str for ours, st in SAFETENSORS_DTYPE.items()}
ROW_BLOCK_BYTES = 64 << 20  # float32 rows decoded per block of a streamed tensor

RowProducer = Callable[[int, int], np.ndarray]  # rows lo:hi of a tensor, in its compute type
Values = np.ndarray | RowProducer | RowReader  # a RowReader may hand over rows already in the storage type


def write_weight_file(path: Path, plan: MemoryPlan, tensors: Mapping[str, Values]) -> None:
    """Write `tensors` (values as the compute type, or row producers) encoded to their planned storage
    types. Atomic: a temporary file renamed into place."""
    slots = sorted(((plan.weights[name], name) for name in tensors), key=lambda s: s[0].address)
    header: dict[str, object] = {"__metadata__": {
        "format": "llmbuild device weights",
        "addresses": json.dumps({name: slot.address for slot, name in slots}, sort_keys=True),
    }}
    offset = 0
    for slot, name in slots:
        header[name] = {"dtype": SAFETENSORS_DTYPE[slot.dtype], "shape": list(slot.shape),
                        "data_offsets": [offset, offset + slot.nbytes]}
        offset += slot.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for slot, name in slots:
                for block in _encoded_blocks(name, slot, tensors[name]):
                    f.write(block)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _encoded_blocks(name: str, slot: Slot, values: Values) -> Iterator[bytes]:
    if not callable(values) and not isinstance(values, RowReader):
        array = np.asarray(values)
        if tuple(array.shape) != tuple(slot.shape):
            raise LlmbuildError(f"tensor {name}: shape {list(array.shape)}, expected {list(slot.shape)}")
        yield _encode(array, slot.dtype).tobytes()
        return
    rows = slot.shape[0]
    row_floats = max(1, int(np.prod(slot.shape[1:])))
    step = max(1, ROW_BLOCK_BYTES // (4 * row_floats))
    reader = values if isinstance(values, RowReader) else None
    produce = reader.rows if reader is not None else values
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        stored = reader.stored_rows(lo, hi, slot.dtype) if reader is not None else None
        if stored is not None:
            yield np.ascontiguousarray(stored).tobytes()
            continue
        block = np.asarray(produce(lo, hi))
        if tuple(block.shape) != (hi - lo, *slot.shape[1:]):
            raise LlmbuildError(f"tensor {name}: rows {lo}..{hi} have shape {list(block.shape)}, "
                                f"expected {[hi - lo, *slot.shape[1:]]}")
        yield _encode(block, slot.dtype).tobytes()


def _encode(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype in ("u8", "i32"):
        return np.ascontiguousarray(encode(values, dtype))
    return np.ascontiguousarray(encode(values.astype(np.float32, copy=False), dtype))


@dataclass(frozen=True)
class StoredWeight:
    """One tensor of a weight file: where it goes in device memory and where its bytes are in the file."""

    address: int
    name: str
    path: Path
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def weight_file_tensors(path: Path, plan: MemoryPlan) -> list[StoredWeight]:
    """Every tensor of a weight file, in address order. Each must be a planned weight with the planned type
    and shape."""
    records = read_header(path, _NUMPY_OF)
    out = []
    for name, (dtype, shape, begin, end) in records.items():
        slot = plan.weights.get(name)
        if slot is None:
            raise LlmbuildError(f"{path}: tensor {name!r} is not a weight of this build's memory plan")
        if (SAFETENSORS_DTYPE[slot.dtype], tuple(slot.shape)) != (dtype, tuple(shape)):
            raise LlmbuildError(f"{path}: tensor {name!r} is {dtype} {list(shape)}, the plan says "
                                f"{SAFETENSORS_DTYPE[slot.dtype]} {list(slot.shape)}")
        out.append(StoredWeight(slot.address, name, path, begin, end))
    return sorted(out, key=lambda t: t.address)


def weight_file_arrays(path: Path, plan: MemoryPlan) -> dict[str, np.ndarray]:
    """Every tensor of a weight file by name, in its storage type (16-bit floats as their bit patterns),
    read-only over one memory map: what the checks read a layer's levels and zero points back from."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    arrays = {}
    for t in weight_file_tensors(path, plan):
        slot = plan.weights[t.name]
        arrays[t.name] = data[t.begin : t.end].view(_NUMPY_OF[SAFETENSORS_DTYPE[slot.dtype]]).reshape(slot.shape)
    return arrays


def open_weight_files(paths: list[Path], plan: MemoryPlan,
                      extra: Mapping[str, np.ndarray] | None = None) -> SlotImage:
    """The weights of `paths` (plus `extra`: name -> values, e.g. computed RoPE tables) by address, as the
    checks' executors read them."""
    tensors: dict[int, np.ndarray] = {}
    for path in paths:
        data = np.memmap(path, dtype=np.uint8, mode="r")
        for t in weight_file_tensors(path, plan):
            tensors[t.address] = data[t.begin : t.end]
    for name, values in (extra or {}).items():
        slot = plan.weights[name]
        tensors[slot.address] = _encode(np.asarray(values), slot.dtype).reshape(-1).view(np.uint8)
    return SlotImage(tensors)

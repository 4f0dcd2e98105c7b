"""The safetensors header, parsed once for every reader: u64 little-endian length, JSON, then the data.

Each reader keeps its own table of accepted dtypes (float checkpoints vs quantized ones with integer
tensors) and builds its own entries from the (name, dtype, shape, begin, end) records returned here.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from llmbuild import LlmbuildError

MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit

Record = tuple[str, tuple[int, ...], int, int]  # dtype, shape, absolute begin, absolute end


def read_header(path: Path, dtypes: Mapping[str, str], missing_hint: str = "") -> dict[str, Record]:
    """name -> (dtype, shape, begin, end) for every tensor; one-line LlmbuildError for a bad file.

    `dtypes` maps the accepted safetensors dtypes to numpy dtypes (used to check each tensor's size)."""
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8) or b"\0" * 8)
            if not 0 < length <= MAX_HEADER_BYTES:
                raise LlmbuildError(f"{path}: not a safetensors file (header length {length})")
            header = json.loads(f.read(length))
        size = path.stat().st_size
    except FileNotFoundError:
        raise LlmbuildError(f"{path}: file not found{missing_hint}") from None
    except (OSError, struct.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LlmbuildError(f"{path}: cannot read safetensors header: {exc}") from None
    start = 8 + length
    records: dict[str, Record] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info.get("dtype")
        if dtype not in dtypes:
            raise LlmbuildError(f"{path}: tensor {name!r} has dtype {dtype}, expected one of {sorted(dtypes)}")
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (start + int(o) for o in info["data_offsets"])
        if end - begin != int(np.prod(shape)) * np.dtype(dtypes[dtype]).itemsize or end > size:
            raise LlmbuildError(f"{path}: tensor {name!r} has data offsets that do not fit its shape")
        records[name] = (dtype, shape, begin, end)
    return records

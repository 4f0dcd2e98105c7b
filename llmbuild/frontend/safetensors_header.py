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

from llmbuild import LlmbuildError, one_line

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
    if not isinstance(header, dict):
        raise LlmbuildError(f"{path}: cannot read safetensors header: expected a JSON object, got "
                            f"{type(header).__name__}")
    start = 8 + length
    records: dict[str, Record] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        shown = one_line(repr(name))
        try:
            dtype = info.get("dtype")
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (start + int(o) for o in info["data_offsets"])
        except (AttributeError, KeyError, TypeError, ValueError):
            raise LlmbuildError(f"{path}: tensor {shown}: expected a header entry with dtype, shape and "
                                f"data_offsets, got {one_line(repr(info))[:120]}") from None
        if dtype not in dtypes:
            raise LlmbuildError(f"{path}: tensor {shown} has dtype {one_line(str(dtype))}, expected one of "
                                f"{sorted(dtypes)}")
        if end > size:
            raise LlmbuildError(f"{path}: the file is truncated: the data of tensor {shown} ends at byte {end}, "
                                f"the file has {size} bytes")
        if min(shape, default=1) < 0 or end - begin != int(np.prod(shape)) * np.dtype(dtypes[dtype]).itemsize:
            raise LlmbuildError(f"{path}: tensor {shown} has data offsets that do not fit its shape {list(shape)}")
        records[name] = (dtype, shape, begin, end)
    return records

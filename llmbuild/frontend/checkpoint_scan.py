"""A Hugging Face checkpoint checked before any build step reads it (`llmbuild prepare`).

Every tensor the architecture needs is present with the shape and dtype config.json implies (the
projections of a quantized checkpoint are left to its import, which checks packing against the config),
and every float tensor in the files holds finite values: a NaN in one layer's weights is refused here,
naming the file and the tensor, instead of flowing through the build into a verification that would
have to catch it. The scan reads each file once in blocks of plain reads (1.1 s for a 1.5B model's 3.5 GB).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.frontend.hf import HFSource

BLOCK_BYTES = 64 << 20
CACHE_WORDS = 1 << 17
# The bits that are all ones in an exponent of NaN or Inf, per float dtype: (word dtype, exponent mask).
_EXPONENT = {"BF16": ("<u2", 0x7F80), "F16": ("<u2", 0x7C00), "F32": ("<u4", 0x7F800000),
             "F64": ("<u8", 0x7FF0000000000000)}


def scan_checkpoint(source: HFSource, skip: frozenset[str] = frozenset()) -> None:
    """Raise one LlmbuildError for the first problem; `skip`: canonical names another reader checks."""
    for name in source.expected_names():
        if name not in skip:
            source.check_entry(name)
    for entry in source.entries():
        spec = _EXPONENT.get(entry.dtype)
        if spec is not None:
            _scan_finite(entry.file, entry.hf_name, entry.begin, entry.end, *spec)


def _scan_finite(file: Path, name: str, begin: int, end: int, word: str, mask: int) -> None:
    itemsize = np.dtype(word).itemsize
    exponent = np.dtype(word).type(mask)
    step = BLOCK_BYTES - BLOCK_BYTES % itemsize
    with open(file, "rb") as f:
        f.seek(begin)
        done = 0
        while begin + done < end:
            block = f.read(min(step, end - begin - done))
            if not block:
                raise LlmbuildError(f"{file}: tensor {name!r}: the file ends inside its data")
            words = np.frombuffer(block, dtype=word)
            # In cache-sized slices, one AND and one max each: a non-finite value has every exponent bit set.
            for lo in range(0, words.size, CACHE_WORDS):
                part = words[lo : lo + CACHE_WORDS]
                if (part & exponent).max(initial=0) == exponent:
                    index = done // itemsize + lo + int(np.flatnonzero((part & exponent) == exponent)[0])
                    raise LlmbuildError(f"{file}: tensor {name!r}: value {index} is NaN or Inf: expected finite "
                                        "weights")
            done += len(block)

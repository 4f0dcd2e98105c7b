"""A Hugging Face checkpoint checked before any build step reads it (`llmbuild prepare`).

Every tensor the architecture needs is present with the shape and dtype config.json implies (the
projections of a quantized checkpoint are left to its import, which checks packing against the config),
and every float tensor in the files holds finite values: a NaN in one layer's weights is refused here,
naming the file and the tensor, instead of flowing through the build into a verification that would
have to catch it. The scan reads each file once in blocks of plain reads (1.1 s for a 1.5B model's 3.5 GB).
A GGUF file is scanned the same way: its float tensors whole, its block-quantized tensors through the
float fields of each block (the scales and minimums; the levels are integers and always finite).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from llmbuild import LlmbuildError, one_line
from llmbuild.frontend.hf import HFSource

BLOCK_BYTES = 64 << 20
CACHE_WORDS = 1 << 17
BLOCK_ROWS = 1 << 20  # quantized blocks whose float fields are gathered at once (a few MiB)
# The bits that are all ones in an exponent of NaN or Inf, per float dtype: (word dtype, exponent mask).
_EXPONENT = {"BF16": ("<u2", 0x7F80), "F16": ("<u2", 0x7C00), "F32": ("<u4", 0x7F800000),
             "F64": ("<u8", 0x7FF0000000000000)}


def scan_checkpoint(source: HFSource, skip: frozenset[str] = frozenset()) -> None:
    """Raise one LlmbuildError for the first problem; `skip`: canonical names another reader checks."""
    for name in source.expected_names():
        if name not in skip:
            source.check_entry(name)
    # One buffer read into for the whole scan, not a fresh 64 MiB bytes object per read (the 1.5B's prepare
    # peaked at 108 MB instead of 170; its time, mostly the kernel copying 3.5 GB of page cache, is unchanged).
    buffer = np.empty(BLOCK_BYTES, dtype=np.uint8)
    for entry in source.entries():
        spec = _EXPONENT.get(entry.dtype)
        if spec is not None:
            _scan_finite(entry.file, entry.hf_name, entry.begin, entry.end, *spec, buffer)


def _scan_finite(file: Path, name: str, begin: int, end: int, word: str, mask: int, buffer: np.ndarray) -> None:
    itemsize = np.dtype(word).itemsize
    exponent = np.dtype(word).type(mask)
    step = buffer.size - buffer.size % itemsize
    with open(file, "rb") as f:
        f.seek(begin)
        done = 0
        while begin + done < end:
            got = f.readinto(memoryview(buffer)[: min(step, end - begin - done)])
            if not got:
                raise LlmbuildError(f"{file}: tensor {name!r}: the file ends inside its data")
            block = buffer[: got - got % itemsize]
            bad = _first_non_finite(block.view(word), exponent)
            if bad is not None:
                raise LlmbuildError(f"{file}: tensor {one_line(repr(name))}: value {done // itemsize + bad} is NaN "
                                    "or Inf: expected finite weights")
            done += got


def _first_non_finite(words: np.ndarray, exponent: np.integer) -> int | None:
    """Index of the first word whose exponent bits are all set (NaN or Inf), or None."""
    # In cache-sized slices, one AND and one max each.
    for lo in range(0, words.size, CACHE_WORDS):
        part = words[lo : lo + CACHE_WORDS]
        if (part & exponent).max(initial=0) == exponent:
            return lo + int(np.flatnonzero((part & exponent) == exponent)[0])
    return None


# Byte offsets of the float fields in one block of each llama.cpp quantized type (ggml-common.h): the
# f16 scale d (and minimum m or dmin); Q8_K's d is an f32.
_GGUF_BLOCK_FLOATS: dict[str, tuple[str, tuple[int, ...]]] = {
    "Q4_0": ("F16", (0,)), "Q4_1": ("F16", (0, 2)), "Q5_0": ("F16", (0,)), "Q5_1": ("F16", (0, 2)),
    "Q8_0": ("F16", (0,)), "Q8_1": ("F32", (0, 4)), "Q2_K": ("F16", (80, 82)), "Q3_K": ("F16", (108,)),
    "Q4_K": ("F16", (0, 2)), "Q5_K": ("F16", (0, 2)), "Q6_K": ("F16", (208,)), "Q8_K": ("F32", (0,)),
}


def scan_gguf(path: Path, tensors: Iterable) -> None:
    """Every float in a GGUF file's tensors (`gguf_index.GGUFTensor`s) finite; one LlmbuildError naming the
    tensor and the element (or block) otherwise. A type without a table entry is refused by the reader."""
    from gguf.constants import GGML_QUANT_SIZES

    for t in tensors:
        kind = t.tensor_type.name
        raw = np.ascontiguousarray(t.data).reshape(-1).view(np.uint8)
        if kind in _EXPONENT:
            word, mask = _EXPONENT[kind]
            bad = _first_non_finite(raw.view(word), np.dtype(word).type(mask))
            where = f"value {bad}"
        elif kind in _GGUF_BLOCK_FLOATS:
            dtype, offsets = _GGUF_BLOCK_FLOATS[kind]
            word, mask = _EXPONENT[dtype]
            size = np.dtype(word).itemsize
            blocks = raw.reshape(-1, GGML_QUANT_SIZES[t.tensor_type][1])
            bad = None
            for lo in range(0, len(blocks), BLOCK_ROWS):  # the float fields of a bounded run of blocks
                rows = blocks[lo : lo + BLOCK_ROWS]
                fields = np.concatenate([rows[:, o : o + size] for o in offsets], axis=1).view(word)
                found = _first_non_finite(fields.reshape(-1), np.dtype(word).type(mask))
                if found is not None:
                    bad = lo + found // len(offsets)
                    break
            where = f"the scale of block {bad}"
        else:
            continue
        if bad is not None:
            raise LlmbuildError(f"{path}: tensor {one_line(repr(t.name))}: {where} is NaN or Inf: expected finite "
                                "weights")

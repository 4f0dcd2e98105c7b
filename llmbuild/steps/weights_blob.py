"""Weights in the device's storage format as one (address, bytes) chunk: tests load a device with it."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.binary.memory_map import MemoryPlan
from llmbuild.numerics.formats import encode


def weight_chunk(plan: MemoryPlan, tensors: Mapping[str, np.ndarray]) -> tuple[int, bytearray]:
    """One contiguous chunk covering `tensors` at their planned addresses (gaps are zero), as written (not
    copied into an immutable bytes: a vision tower's is a gigabyte)."""
    slots = sorted(((plan.weights[n], n) for n in tensors), key=lambda s: s[0].address)
    base = slots[0][0].address
    end = max(s.address + s.nbytes for s, _ in slots)
    buf = bytearray(end - base)
    for slot, name in slots:
        value = np.asarray(tensors[name])
        if tuple(value.shape) != tuple(slot.shape):
            raise LlmbuildError(f"tensor {name}: shape {list(value.shape)}, expected {list(slot.shape)}")
        _encode_into(buf, slot.address - base, value, slot.dtype)
    return base, buf


ENCODE_BLOCK = 1 << 22  # elements a step: a tower's largest tensor (317 MB in float32) is never copied whole


def _encode_into(buf: bytearray, offset: int, value: np.ndarray, dtype: str) -> None:
    """`value` encoded as `dtype` into `buf` from `offset`, a block at a time (the float32 copy, the encoded
    one and its bytes of a whole tensor were 0.74 GiB more at the vision step's peak)."""
    flat = value.reshape(-1)
    at = offset
    with memoryview(buf) as view:
        for lo in range(0, flat.size, ENCODE_BLOCK):
            part = encode(np.asarray(flat[lo : lo + ENCODE_BLOCK], dtype=np.float32), dtype)
            view[at : at + part.nbytes] = np.ascontiguousarray(part).view(np.uint8)
            at += part.nbytes

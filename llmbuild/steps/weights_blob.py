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
        raw = encode(value.astype(np.float32), slot.dtype).tobytes()
        buf[slot.address - base : slot.address - base + len(raw)] = raw
    return base, buf

"""The weight image a vision step checks on: each tensor encoded at its planned address, a block at a time."""

from __future__ import annotations

import numpy as np
import pytest

from llmbuild import LlmbuildError
from llmbuild.binary.memory_map import MemoryPlan, Slot
from llmbuild.numerics.formats import encode
from llmbuild.steps import weights_blob
from llmbuild.steps.weights_blob import weight_chunk


def _plan(slots: dict[str, Slot]) -> MemoryPlan:
    return MemoryPlan(alignment=64, weights=slots, kv={}, io={}, regions={"weight": (4096, 1 << 20)},
                      activation_base=1 << 21)


def test_each_tensor_is_its_whole_encoding_at_its_address_whatever_the_block(monkeypatch):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((37, 13), dtype=np.float32),
               "b": rng.standard_normal((5, 7), dtype=np.float32).T,  # not contiguous
               "c": rng.standard_normal(11).astype(np.float16)}
    slots = {"a": Slot(4096 + 512, "bf16", (37, 13)), "b": Slot(4096, "f32", (7, 5)),
             "c": Slot(4096 + 2048, "f16", (11,))}
    monkeypatch.setattr(weights_blob, "ENCODE_BLOCK", 8)  # a tensor spans several blocks, one ends mid-block
    base, image = weight_chunk(_plan(slots), tensors)
    assert base == 4096 and isinstance(image, bytearray)
    want = bytearray(len(image))
    for name, slot in slots.items():
        raw = encode(np.asarray(tensors[name], dtype=np.float32), slot.dtype).tobytes()
        want[slot.address - base : slot.address - base + len(raw)] = raw
    assert image == want
    assert len(image) == 2048 + 11 * 2


def test_a_misshapen_tensor_is_one_line_naming_it():
    with pytest.raises(LlmbuildError, match=r"tensor a: shape \[3, 4\], expected \[4, 3\]"):
        weight_chunk(_plan({"a": Slot(4096, "f32", (4, 3))}), {"a": np.zeros((3, 4), np.float32)})

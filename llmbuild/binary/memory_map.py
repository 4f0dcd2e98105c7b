"""The device-memory map a binary carries (plan.json, the `memory` of the binary's meta): every weight,
KV-cache and IO buffer at a fixed address, and the regions. `codegen/memory_plan.py` computes it; the
runtime reads it. Layout, each region aligned to the chip's global alignment:

    [ weights: rope tables, embedding, layer 0 .. N-1, final norm, lm_head ]   stored once
    [ kv cache: layer i k, layer i v, each [S, kv_heads, head_dim] ]          persistent
    [ io: input_ids, hidden ping-pong, position_ids, mask, present k/v, ... ] net inputs/outputs
    [ activations ]                                                            reused by every net
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from llmbuild.numerics.formats import itemsize

ACTIVATION_ALIGN = 64


def align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class Slot:
    address: int
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = itemsize(self.dtype)
        for s in self.shape:
            n *= s
        return n


@dataclass
class MemoryPlan:
    alignment: int
    weights: dict[str, Slot]
    kv: dict[str, Slot]
    io: dict[str, Slot]
    regions: dict[str, tuple[int, int]]  # name -> (base, size); activation size is set at link
    activation_base: int

    def to_json(self) -> str:
        data = asdict(self)
        return json.dumps(data, indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> MemoryPlan:
        d = json.loads(text)

        def slots(m: dict) -> dict[str, Slot]:
            return {k: Slot(v["address"], v["dtype"], tuple(v["shape"])) for k, v in m.items()}

        return MemoryPlan(
            alignment=d["alignment"],
            weights=slots(d["weights"]),
            kv=slots(d["kv"]),
            io=slots(d["io"]),
            regions={k: tuple(v) for k, v in d["regions"].items()},
            activation_base=d["activation_base"],
        )

    @staticmethod
    def read(path: Path) -> MemoryPlan:
        return MemoryPlan.from_json(path.read_text())

    def binding(self, net: str, layer: int, arg: str) -> Slot:
        """The fixed buffer a net input or output is bound to."""
        if arg in ("history_k", "history_v"):
            return self.kv[f"layers.{layer}.{arg[-1]}"]
        if arg == "hidden_states" and layer >= 0:
            raise KeyError("block hidden states are bound with hidden_binding()")
        if net == "lm_head":
            return self.io["lm_in" if arg == "hidden_states" else arg]
        if net.startswith("embedding"):
            return self.io["input_ids" if arg == "input_ids" else "hidden.0"]
        return self.io[arg]

    def hidden_binding(self, layer: int, output: bool) -> Slot:
        # Layers ping-pong between two hidden buffers: layer i reads hidden.{i%2}, writes the other.
        return self.io[f"hidden.{(layer + int(output)) % 2}"]

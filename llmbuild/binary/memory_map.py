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

from llmbuild import LlmbuildError
from llmbuild.numerics.formats import STORAGE, itemsize

ACTIVATION_ALIGN = 64


def align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


MAX_SLOT_RANK = 8
MAX_ADDRESS = 1 << 48  # far above any device's memory


def _count(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and 0 <= n < MAX_ADDRESS


def _expect(ok: bool, where: str, what: str, got: object) -> None:
    if not ok:
        text = repr(got)
        raise LlmbuildError(f"{where}: expected {what}, got {text[:60] + '...' if len(text) > 60 else text}")


def _field(d: dict, key: str, kind: type, what: str, where: str = "plan"):
    _expect(key in d, f"{where}.{key}", what, "nothing")
    value = d[key]
    _expect(isinstance(value, kind) and not (kind is int and isinstance(value, bool)), f"{where}.{key}", what,
            value)
    return value


def _address(d: dict, key: str, where: str) -> int:
    value = _field(d, key, int, "a non-negative integer", where)
    _expect(_count(value), f"{where}.{key}", f"a non-negative integer below {MAX_ADDRESS}", value)
    return value


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
        """The plan a binary or a build wrote, every field checked for its type and bounds (a binary is
        signed by whoever wrote it: a wrong value is one LlmbuildError naming the field, never a TypeError
        in the runtime)."""
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise LlmbuildError(f"plan: not JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from None
        _expect(isinstance(d, dict), "plan", "an object", d)

        def slots(key: str) -> dict[str, Slot]:
            m = _field(d, key, dict, "an object of slots")
            out = {}
            for name, v in m.items():
                where = f"plan.{key}.{name}"
                _expect(isinstance(v, dict), where, "an object with address, dtype and shape", v)
                dtype = _field(v, "dtype", str, "a dtype name", where)
                _expect(dtype in STORAGE, f"{where}.dtype", f"one of {', '.join(STORAGE)}", dtype)
                shape = _field(v, "shape", list, "a list of dimensions", where)
                _expect(len(shape) <= MAX_SLOT_RANK and all(_count(n) for n in shape), f"{where}.shape",
                        f"at most {MAX_SLOT_RANK} non-negative integer dimensions", shape)
                out[name] = Slot(_address(v, "address", where), dtype, tuple(shape))
            return out

        regions = {}
        for name, v in _field(d, "regions", dict, "an object of [base, size] pairs").items():
            _expect(isinstance(v, list) and len(v) == 2 and all(_count(n) for n in v), f"plan.regions.{name}",
                    "[base, size], two non-negative integers", v)
            regions[name] = (int(v[0]), int(v[1]))
        alignment = _field(d, "alignment", int, "a positive integer")
        _expect(_count(alignment) and alignment > 0, "plan.alignment", "a positive integer", alignment)
        plan = MemoryPlan(alignment=alignment, weights=slots("weights"), kv=slots("kv"), io=slots("io"),
                          regions=regions, activation_base=_address(d, "activation_base", "plan"))
        # Every slot inside its region: a size no device holds is refused here, not allocated by a runtime.
        for group, region in (("weights", "weight"), ("kv", "kv"), ("io", "io")):
            base, size = regions.get(region, (0, 0))
            for name, slot in getattr(plan, group).items():
                _expect(base <= slot.address and slot.address + slot.nbytes <= base + size,
                        f"plan.{group}.{name}", f"a slot inside the {region} region [{base}, {base + size})",
                        f"{slot.nbytes} bytes at {slot.address}")
        return plan

    @staticmethod
    def read(path: Path) -> MemoryPlan:
        return MemoryPlan.from_json(path.read_text())

    def binding(self, net: str, layer: int, arg: str) -> Slot:
        """The fixed buffer a net input or output is bound to."""
        if arg in ("history_k", "history_v"):
            return self.kv[f"layers.{layer}.{arg[-1]}"]
        if arg.startswith("state_"):  # a linear-attention layer's state, read in place like a KV history
            return self.kv[f"layers.{layer}.{arg.removeprefix('state_')}"]
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

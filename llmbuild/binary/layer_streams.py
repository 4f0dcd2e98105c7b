"""Which layers' programs are the same program: a layer's command stream with its base addresses named.

The build runs the command stream (the layer groups: what the chip runs) on the simulated device for a few
sampled layers only and the rest on the host path. That covers the whole binary only if every other layer's
stream is one of the sampled ones apart from where its weights, its KV cache and its ping-pong hidden buffer
live. `stream_key` replaces each global address by the plan slot it falls in (a layer's own slots named
without the layer's index, the hidden buffers by their parity relative to the layer) and the layer's index
in its locations, and hashes the result: two layers with the same key differ only in those bases.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from dataclasses import replace

from llmbuild.binary.memory_map import MemoryPlan
from llmbuild.binary.program import Instr, Program, encode

_LAYER = re.compile(r"(?<![\w.])layers\.(\d+)\.")


def _without_index(text: str, layer: int) -> str:
    """`layers.<layer>.` in `text` written `layers.*.` (another layer's name is left as it is)."""
    return _LAYER.sub(lambda m: "layers.*." if int(m.group(1)) == layer else m.group(0), text)


class SlotNames:
    """The plan's global slots by address, for naming the address a tensor sits at."""

    def __init__(self, plan: MemoryPlan):
        slots = [(s.address, s.nbytes, name) for group in (plan.weights, plan.kv, plan.io)
                 for name, s in group.items()]
        slots.sort()
        self.starts = [a for a, _, _ in slots]
        self.slots = slots

    def name(self, address: int, layer: int) -> str | None:
        """`<slot>+<offset>` for an address inside a slot (the layer's own slots without its index), or None
        for one outside every slot (the activation region, reused by every net at the same addresses)."""
        i = bisect.bisect_right(self.starts, address) - 1
        if i < 0:
            return None
        start, size, name = self.slots[i]
        if address >= start + max(size, 1):
            return None
        name = _without_index(name, layer)
        if name.startswith("hidden."):  # layer i reads hidden.{i % 2} and writes the other one
            name = f"hidden.{(int(name.split('.')[1]) - layer) % 2}"
        return f"{name}+{address - start}"


def stream_key(prog: Program, slots: SlotNames) -> str:
    """A digest of `prog` (a block net) with its bases named: equal for two layers whose programs differ only
    in the addresses of their own weights, KV cache and hidden buffers."""
    layer = prog.layer
    names: dict[int, str] = {}
    tensors = []
    for i, t in enumerate(prog.tensors):
        if not t.local and (name := slots.name(t.address, layer)) is not None:
            names[i] = name
            t = replace(t, address=0)
        tensors.append(t)

    def strip(instr: Instr) -> Instr:
        return replace(instr, loc=_without_index(instr.loc, layer))

    canonical = replace(prog, net=re.sub(r"\d+$", "*", prog.net), layer=-1, tensors=tensors,
                        instrs=[strip(i) for i in prog.instrs],
                        groups=[replace(g, cmds=[strip(c) for c in g.cmds]) for g in prog.groups])
    h = hashlib.sha256(encode(canonical))
    h.update(repr(sorted(names.items())).encode())
    return h.hexdigest()[:16]


__all__ = ["SlotNames", "stream_key"]

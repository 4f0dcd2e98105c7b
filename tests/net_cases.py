"""A compiled net with its plan, weights and inputs, loaded on the simulated device and run: shared by the
layer-group and flash-attention tests."""

from __future__ import annotations

import dataclasses

import numpy as np

from llmbuild.build.compile_net import CompiledNet
from llmbuild.build.weights_blob import weight_chunk
from llmbuild.codegen.program import Program
from llmbuild.passes.memory_plan import MemoryPlan
from llmbuild.runtime.device import Device


@dataclasses.dataclass
class Case:
    net: CompiledNet
    plan: MemoryPlan
    weights: dict[str, np.ndarray]
    inputs: dict[str, np.ndarray]


def load(case: Case, prog: Program | None = None, lmem_bytes: int | None = None, extra: int = 0) -> Device:
    """A device holding the case's weights (as the linker lays them out) and inputs, with `lmem_bytes` of
    local memory (the chip's when None) and `extra` bytes of global memory past the activations."""
    prog = prog or case.net.program
    size = case.plan.activation_base + prog.activation_bytes + extra
    dev = Device(size, tuple(case.plan.regions["weight"]), lmem_bytes)
    base, blob = weight_chunk(case.plan, case.weights)
    dev.load_bytes(base, blob)
    for name, value in case.inputs.items():
        dev.set_input(prog, name, value)
    return dev


def run(case: Case, prog: Program | None = None, grouped: bool = True, **kw) -> dict[str, np.ndarray]:
    """Every output of the program run on a fresh device."""
    prog = prog or case.net.program
    dev = load(case, prog, **kw)
    dev.run(prog, grouped=grouped)
    return {name: dev.get_output(prog, name) for name, _ in prog.outputs}

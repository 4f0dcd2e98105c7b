"""A compiled net with its plan, weights and inputs, loaded on the simulated device and run: shared by the
layer-group and flash-attention tests."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import numpy as np
import pytest

from llmbuild.binary.memory_map import MemoryPlan
from llmbuild.binary.program import Program
from llmbuild.dialects import module_text, parse_module_text
from llmbuild.dialects.interpret import Execution, interpret
from llmbuild.runtime.device import Device
from llmbuild.steps.compile_net import CompiledNet
from llmbuild.steps.weights_blob import weight_chunk


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


def run(case: Case, prog: Program | None = None, **kw) -> dict[str, np.ndarray]:
    """Every output of the program run on a fresh device."""
    prog = prog or case.net.program
    dev = load(case, prog, **kw)
    dev.run(prog)
    return {name: dev.get_output(prog, name) for name, _ in prog.outputs}


def assert_grouped_run_is_exact(case: Case, label: str) -> Execution:
    """The program's layer groups on the device give, bit for bit, the `tpu` module's interpretation (the
    op list), for every output and every op (reassembled from tiles and key blocks). Returns the
    interpretation."""
    prog = case.net.program
    want = interpret(case.net.tpu, case.inputs, case.weights.__getitem__, reference=False)
    traced: dict[str, np.ndarray] = {}
    dev = load(case)
    dev.run(prog, trace=lambda loc, v: traced.__setitem__(loc, v.copy()))
    for out, _ in prog.outputs:
        got = dev.get_output(prog, out)
        np.testing.assert_array_equal(got, want.outputs[out], err_msg=f"{label} {out}")
    assert list(traced) == [i.loc for i in prog.instrs]
    for loc, value in traced.items():
        np.testing.assert_array_equal(value, want.by_loc[loc], err_msg=f"{label} {loc}")
    return want


def assert_round_trips_and_mlir_opt_parses(text: str) -> None:
    """Grouped IR text parses back to itself, and upstream mlir-opt parses it (skipped without mlir-opt)."""
    assert module_text(parse_module_text(text, "grouped.mlir")) == text
    tool = shutil.which("mlir-opt-22") or shutil.which("mlir-opt")
    if tool is None:
        pytest.skip("mlir-opt not installed")
    r = subprocess.run([tool, "--allow-unregistered-dialect"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:2000]

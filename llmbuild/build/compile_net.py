"""Compile one TopOp net: canonicalize, lower to tpu for the recipe's mode, assign addresses, and
generate its program. Both .mlir forms are written beside the object so a person can open them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from xdsl.dialects.builtin import ModuleOp

from llmbuild.build.paths import write_text_atomic
from llmbuild.codegen.program import Program, from_module
from llmbuild.dialects import module_text
from llmbuild.passes import pipeline_string, run_passes
from llmbuild.passes.assign_address import assign_addresses
from llmbuild.passes.canonicalize import Canonicalize
from llmbuild.passes.lower_top_to_tpu import LowerTopToTpu
from llmbuild.passes.memory_plan import MemoryPlan


@dataclass
class CompiledNet:
    name: str
    top: ModuleOp
    tpu: ModuleOp
    program: Program


def compile_net(top: ModuleOp, plan: MemoryPlan, mode: str, chip: str, out_dir: Path) -> CompiledNet:
    net = top.attributes["top.net"].data
    run_passes(top, [Canonicalize()])
    write_text_atomic(out_dir / f"top_{net}.mlir", module_text(top))
    tpu = top.clone()
    lowering = [LowerTopToTpu(mode=mode, chip=chip)]
    run_passes(tpu, lowering)
    assign_addresses(tpu, plan)
    tpu.verify()
    header = f"// pipeline: canonicalize,{pipeline_string(lowering)},assign-address\n"
    write_text_atomic(out_dir / f"tpu_{net}.mlir", header + module_text(tpu))
    return CompiledNet(net, top, tpu, from_module(tpu))

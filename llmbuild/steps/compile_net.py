"""Compile one TopOp net: canonicalize, lower to tpu for the recipe's mode, assign addresses, cut into
layer groups for the chip's local memory, and generate its program. The TopOp and the grouped TpuOp
forms are written beside the object so a person can open them.

`tpu` is the address-assigned net before grouping (with the tile attributes the grouping chose): the op
list the host path and the interpreter run; `grouped` is the same net as layer groups, which the device
runs. The program carries both (binary/program.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from xdsl.dialects.builtin import ModuleOp

from llmbuild.artifacts.paths import write_text_atomic
from llmbuild.binary.memory_map import MemoryPlan
from llmbuild.binary.program import Program
from llmbuild.chips import load_chip
from llmbuild.codegen.emit import from_module
from llmbuild.codegen.groups import add_groups
from llmbuild.dialects import module_text
from llmbuild.passes import pipeline_string, run_passes
from llmbuild.passes.assign_address import assign_addresses
from llmbuild.passes.canonicalize import Canonicalize
from llmbuild.passes.layer_group import LayerGroup, annotate_tiles, group_module, plan_module, remap_plans
from llmbuild.passes.lower_top_to_tpu import LowerTopToTpu


@dataclass
class CompiledNet:
    name: str
    top: ModuleOp
    tpu: ModuleOp
    program: Program
    grouped: ModuleOp | None = None


def compile_net(top: ModuleOp, plan: MemoryPlan, mode: str, chip: str, out_dir: Path,
                lmem_bytes: int | None = None) -> CompiledNet:
    """`lmem_bytes` overrides the chip's local memory (tests use it to force tiling)."""
    net = top.attributes["top.net"].data
    run_passes(top, [Canonicalize()])
    write_text_atomic(out_dir / f"top_{net}.mlir", module_text(top))
    tpu = top.clone()
    lowering = [LowerTopToTpu(mode=mode, chip=chip)]
    run_passes(tpu, lowering)
    assign_addresses(tpu, plan)
    target = load_chip(chip)
    plans = plan_module(tpu, target, lmem_bytes)
    annotate_tiles(tpu, plans)
    tpu.verify()
    grouped = tpu.clone()
    group_module(grouped, remap_plans(plans, tpu, grouped))
    grouped.verify()
    grouping = LayerGroup(chip=chip, lmem_bytes=lmem_bytes or 0)
    header = f"// pipeline: canonicalize,{pipeline_string(lowering)},assign-address,{pipeline_string([grouping])}\n"
    write_text_atomic(out_dir / f"tpu_{net}.mlir", header + module_text(grouped))
    program = from_module(tpu)
    add_groups(program, grouped)
    return CompiledNet(net, top, tpu, program, grouped)

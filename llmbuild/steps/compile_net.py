"""Compile one TopOp net: canonicalize, lower to tpu for the recipe's mode, assign addresses, cut into
layer groups for the chip's local memory, and generate its program. The TopOp and the grouped TpuOp
forms are written beside the object so a person can open them.

The passes are one pipeline string (passes/pipeline.py), parsed and run; the first line of tpu_*.mlir is
that string, so `llmbuild opt top_<net>.mlir --pipeline "<it>"` reproduces the grouped module. It runs on
one lineage of modules: `canonicalize` on the TopOp net (written as top_*.mlir), the passes up to
`layer-group` on a clone of it, which is `tpu`: the address-assigned net before grouping, with the tile
attributes the grouping chose, the op list the host path and the interpreter run; `layer-group` on a clone
of `tpu`, which is `grouped`: the same net as layer groups, which the device runs. The program carries
both (binary/program.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from xdsl.dialects.builtin import ModuleOp

from llmbuild.artifacts.paths import write_text_atomic
from llmbuild.binary.program import Program
from llmbuild.codegen.emit import from_module
from llmbuild.codegen.groups import add_groups
from llmbuild.dialects import module_text
from llmbuild.passes import pipeline_string, run_passes
from llmbuild.passes.assign_address import AssignAddress
from llmbuild.passes.canonicalize import Canonicalize
from llmbuild.passes.layer_group import LayerGroup, PlanLayerGroups
from llmbuild.passes.lower_top_to_tpu import LowerTopToTpu
from llmbuild.passes.pipeline import HEADER, parse_pipeline


@dataclass
class CompiledNet:
    name: str
    top: ModuleOp
    tpu: ModuleOp
    program: Program
    grouped: ModuleOp | None = None


def net_pipeline(plan: Path, mode: str, chip: str, lmem_bytes: int | None = None) -> str:
    """The pipeline that compiles a net: from the TopOp net to the grouped tpu net."""
    return pipeline_string([
        Canonicalize(), LowerTopToTpu(mode=mode, chip=chip), AssignAddress(plan=str(plan)),
        PlanLayerGroups(chip=chip, lmem_bytes=lmem_bytes or 0), LayerGroup(),
    ])


def compile_net(top: ModuleOp, plan: Path, mode: str, chip: str, out_dir: Path,
                lmem_bytes: int | None = None) -> CompiledNet:
    """`plan`: the memory plan's JSON file (`llmbuild plan`), which assign-address reads. `lmem_bytes`
    overrides the chip's local memory (tests use it to force tiling)."""
    net = top.attributes["top.net"].data
    # The plan as the written line names it: relative to the module files, so no machine path is written.
    pipeline = net_pipeline(Path(os.path.relpath(plan, out_dir)), mode, chip, lmem_bytes)
    first, *to_tpu, last = parse_pipeline(pipeline, relative_to=out_dir)
    assert first.name == Canonicalize.name and last.name == LayerGroup.name, pipeline
    run_passes(top, [first])
    write_text_atomic(out_dir / f"top_{net}.mlir", module_text(top))
    tpu = run_passes(top.clone(), to_tpu)
    grouped = run_passes(tpu.clone(), [last])
    write_text_atomic(out_dir / f"tpu_{net}.mlir", f"{HEADER}{pipeline}\n{module_text(grouped)}")
    program = from_module(tpu)
    add_groups(program, grouped)
    return CompiledNet(net, top, tpu, program, grouped)

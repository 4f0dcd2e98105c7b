"""llmbuild's passes by name, and pass pipelines parsed from the string a person reads and reruns.

A pipeline is MLIR's textual form, parsed by xDSL's own parser, e.g.
`canonicalize,lower-top-to-tpu{mode="bf16"},assign-address{plan="../plan.json"},plan-layer-groups,layer-group`.
The build writes the pipeline it ran as the first line of every tpu_*.mlir (steps/compile_net.py), and
`llmbuild opt` runs one on a module file as `mlir-opt` would. A relative file named by a pass option is
relative to the module files' folder, so the written line names no machine path and still reruns after the
build folder moves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from xdsl.passes import ModulePass, PassPipeline

from llmbuild import LlmbuildError


def _canonicalize() -> type[ModulePass]:
    from llmbuild.passes.canonicalize import Canonicalize

    return Canonicalize


def _lower_top_to_tpu() -> type[ModulePass]:
    from llmbuild.passes.lower_top_to_tpu import LowerTopToTpu

    return LowerTopToTpu


def _assign_address() -> type[ModulePass]:
    from llmbuild.passes.assign_address import AssignAddress

    return AssignAddress


def _plan_layer_groups() -> type[ModulePass]:
    from llmbuild.passes.layer_group import PlanLayerGroups

    return PlanLayerGroups


def _layer_group() -> type[ModulePass]:
    from llmbuild.passes.layer_group import LayerGroup

    return LayerGroup


# Name -> the pass class, imported when a pipeline names it (xDSL's registry convention).
PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "canonicalize": _canonicalize,
    "lower-top-to-tpu": _lower_top_to_tpu,
    "assign-address": _assign_address,
    "plan-layer-groups": _plan_layer_groups,
    "layer-group": _layer_group,
}


HEADER = "// pipeline: "  # the first line of a tpu_*.mlir: the pipeline that made it from its top_*.mlir


def header_pipeline(text: str, origin: str = "module") -> str:
    """The pipeline a written tpu_*.mlir names on its first line."""
    first = text.split("\n", 1)[0]
    if not first.startswith(HEADER):
        raise LlmbuildError(f"{origin}: the first line is not `{HEADER.strip()} <passes>`")
    return first.removeprefix(HEADER)


def parse_pipeline(spec: str, relative_to: Path | None = None) -> list[ModulePass]:
    """The passes `spec` names; `relative_to`: the folder a relative file option (assign-address's plan) is
    read from (the module files' folder for a build's own line; else the working directory)."""
    try:
        passes = list(PassPipeline.parse_spec(PASSES, spec).passes)
    except Exception as exc:  # xDSL raises ValueError or its own parse errors
        raise LlmbuildError(f"pipeline {spec!r}: {exc}; passes: {', '.join(PASSES)}") from None
    if relative_to is None:
        return passes
    return [dataclasses.replace(p, plan=str(relative_to / p.plan))
            if isinstance(getattr(p, "plan", None), str) and not Path(p.plan).is_absolute() else p
            for p in passes]

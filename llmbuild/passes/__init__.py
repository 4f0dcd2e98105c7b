"""Passes over top/tpu modules, one per file, and the pipelines that chain them.

Each pass is an xDSL `ModulePass` with a kebab-case name and its options as fields, so a pipeline is a
string a person can read and rerun, e.g. `canonicalize,lower-top-to-tpu{mode=bf16},assign-address`.
"""

from __future__ import annotations

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from llmbuild.dialects import make_context


def run_passes(module: ModuleOp, passes: list[ModulePass]) -> ModuleOp:
    ctx = make_context()
    for p in passes:
        p.apply(ctx, module)
        module.verify()
    return module


def pipeline_string(passes: list[ModulePass]) -> str:
    return ",".join(p.pipeline_pass_spec().__str__() for p in passes)

"""The check that every compute op has each piece derived from its definition.

An op is defined once (`llmbuild/op_defs/`, docs/design.md "Adding an op"); each layer derives its own piece
from the definitions. `current_pieces` collects the pieces as the code has them, `derived_pieces` derives
them afresh for any list of definitions (a test adds an op that way), and `missing_pieces` names what one
op lacks; tests/test_op_registry.py fails on any.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from llmbuild.op_defs import BY_NAME, COSTS, GROUPINGS, OPS, REAL_ROWS, OpDef

__all__ = ["BY_NAME", "OPS", "Pieces", "current_pieces", "derived_pieces", "missing_pieces"]


@dataclass(frozen=True)
class Pieces:
    """The pieces derived from the definitions, by where they live; a test removes one."""

    top_ops: Mapping[str, type]  # "top.X" -> class
    tpu_ops: Mapping[str, type]  # "tpu.X" -> class
    lowering: Mapping[str, type]  # "top.X" -> tpu class
    opcodes: Mapping[str, int]
    kernels: Mapping[str, Callable]  # the host's kernels, by op name without the dialect
    spec_kernels: Mapping[str, Callable]
    row_local: frozenset[str]  # "tpu.X" the layer-group planner tiles by rows
    mac_ops: tuple[str, ...]
    vector_ops: Mapping[str, int]  # vector operations per output element
    attention_ops: tuple[str, ...]
    # "top.X" the vendor's exporters translate (hand-written in bmodel/: the vendor's forms are its own)
    vendor_exports: frozenset[str]
    recurrence_ops: tuple[str, ...] = ()


def current_pieces() -> Pieces:
    """The pieces the compiler and the runtime use."""
    from llmbuild.binary.program import OPCODE_OF
    from llmbuild.bmodel.vit_export import exported_top_ops
    from llmbuild.cost import group_timing
    from llmbuild.dialects import top, tpu
    from llmbuild.numerics.kernels import KERNELS
    from llmbuild.op_defs import SPEC_KERNELS
    from llmbuild.passes.layer_group_plan import ROW_LOCAL
    from llmbuild.passes.lower_top_to_tpu import TOP_TO_TPU

    return Pieces(
        top_ops={op.name: op for op in top.Top.operations},
        tpu_ops={op.name: op for op in tpu.Tpu.operations},
        lowering=dict(TOP_TO_TPU),
        opcodes=dict(OPCODE_OF),
        kernels=dict(KERNELS),
        spec_kernels=dict(SPEC_KERNELS),
        row_local=frozenset(ROW_LOCAL),
        mac_ops=tuple(group_timing.MAC_OPS),
        vector_ops=dict(group_timing.EU_OPS_PER_ELEMENT),
        attention_ops=tuple(group_timing.ATTENTION_OPS),
        recurrence_ops=tuple(group_timing.RECURRENCE_OPS),
        vendor_exports=exported_top_ops(),
    )


def derived_pieces(defs: Iterable[OpDef]) -> Pieces:
    """Every piece derived from `defs` by the functions each layer derives its own with."""
    from llmbuild.binary.program import opcode_table
    from llmbuild.bmodel.vit_export import exported_top_ops
    from llmbuild.cost.group_timing import cost_tables
    from llmbuild.dialects import from_definitions
    from llmbuild.numerics.kernels import host_kernels
    from llmbuild.op_defs import spec_kernels
    from llmbuild.passes.layer_group_plan import row_local_ops
    from llmbuild.passes.lower_top_to_tpu import lowering_table

    defs = tuple(defs)
    tpu_ops = from_definitions.tpu_classes(defs)
    costs = cost_tables(defs)
    return Pieces(
        top_ops=from_definitions.top_classes(defs),
        tpu_ops=tpu_ops,
        lowering=lowering_table(defs, tpu_ops),
        opcodes=opcode_table(defs),
        kernels=host_kernels(defs),
        spec_kernels=spec_kernels(defs),
        row_local=row_local_ops(defs),
        mac_ops=costs.mac_ops,
        vector_ops=costs.vector_ops,
        attention_ops=costs.attention_ops,
        recurrence_ops=costs.recurrence_ops,
        vendor_exports=exported_top_ops(),
    )


def missing_pieces(op: OpDef, pieces: Pieces) -> list[str]:
    """What `op` lacks, one short phrase each naming the piece and where it is derived; [] when complete."""
    missing = []
    if not callable(op.spec):
        missing.append(f"a spec kernel in the definition of {op.name}")
    tpu_name = f"tpu.{op.name}"
    tpu_class = pieces.tpu_ops.get(tpu_name)
    if tpu_class is None:
        missing.append(f"{tpu_name} in dialects/tpu.py")
    elif not tpu_class.__doc__:
        missing.append(f"a docstring on {tpu_name}")
    for form in op.top_forms():
        top_name = f"top.{form.name}"
        top_class = pieces.top_ops.get(top_name)
        if top_class is None:
            missing.append(f"{top_name} in dialects/top.py")
        elif not top_class.__doc__:
            missing.append(f"a docstring on {top_name}")
        if tpu_class is not None and pieces.lowering.get(top_name) is not tpu_class:
            missing.append(f"the lowering {top_name} -> {tpu_name} in passes/lower_top_to_tpu.py")
        if op.exported and form.exported and top_name not in pieces.vendor_exports:
            missing.append(f"the vendor export op_{form.name} in bmodel/top_export.py or bmodel/vit_export.py "
                           "(or exported=False in the definition or the form: its nets then build no .bmodel)")
        for table, where in ((pieces.kernels, "numerics/kernels.KERNELS"),
                             (pieces.spec_kernels, "op_defs.SPEC_KERNELS")):
            if form.name not in table:
                missing.append(f"the kernel {form.name!r} (the interpreter runs top ops) in {where}")
    if pieces.opcodes.get(op.name) != op.opcode:
        missing.append(f"the opcode {op.opcode} of {op.name} in binary/program.OPCODE_OF")
    elif list(pieces.opcodes.values()).count(op.opcode) != 1:
        missing.append(f"an opcode of {op.name} no other op has in binary/program.OPCODE_OF")
    if op.name not in pieces.kernels:
        missing.append(f"the kernel {op.name!r} in numerics/kernels.KERNELS")
    if op.name not in pieces.spec_kernels:
        missing.append(f"the spec kernel {op.name!r} in op_defs.SPEC_KERNELS")
    if op.grouping not in GROUPINGS:
        missing.append(f"a grouping among {', '.join(GROUPINGS)}")
    elif (op.grouping == "row_local") != (tpu_name in pieces.row_local):
        where = "in" if op.grouping == "row_local" else "out of"
        missing.append(f"{tpu_name} {where} ROW_LOCAL in passes/layer_group_plan.py")
    if op.real_rows not in REAL_ROWS:
        missing.append(f"real_rows among {', '.join(REAL_ROWS)}")
    cost_table = {"mac": op.name in pieces.mac_ops, "attention": op.name in pieces.attention_ops,
                  "vector": pieces.vector_ops.get(op.name) == op.vector_ops,
                  "view": pieces.vector_ops.get(op.name) == 0, "recurrence": op.name in pieces.recurrence_ops}
    if op.cost not in COSTS or not cost_table[op.cost]:
        missing.append(f"the {op.cost} cost of {op.name} in cost/group_timing.py")
    return missing

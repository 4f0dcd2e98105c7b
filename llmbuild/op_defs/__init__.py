"""Every compute op, each defined once in a module of its own (`OpDef`: names, opcode, shape, traits and the
plain numpy spec kernel); see op_definition.py for what is derived from a definition, and where.

This package needs neither xDSL nor the compiler: the binary format and the runtime read it too.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmbuild.op_defs.a16_gather import A16_GATHER
from llmbuild.op_defs.a16_matmul import A16_MATMUL
from llmbuild.op_defs.active import ACTIVE
from llmbuild.op_defs.add import ADD
from llmbuild.op_defs.cast import CAST
from llmbuild.op_defs.causal_conv1d import CAUSAL_CONV1D
from llmbuild.op_defs.concat import CONCAT
from llmbuild.op_defs.fattention import FATTENTION
from llmbuild.op_defs.gated_delta_rule import GATED_DELTA_RULE
from llmbuild.op_defs.gather import GATHER
from llmbuild.op_defs.l2_norm import L2_NORM
from llmbuild.op_defs.layer_norm import LAYER_NORM
from llmbuild.op_defs.matmul import MATMUL
from llmbuild.op_defs.mul import MUL
from llmbuild.op_defs.op_definition import COSTS, GROUPINGS, REAL_ROWS, Kernel, OpDef, TopForm, with_attrs
from llmbuild.op_defs.permute import PERMUTE
from llmbuild.op_defs.reshape import RESHAPE
from llmbuild.op_defs.rms_norm import RMS_NORM
from llmbuild.op_defs.rotary_embedding import ROPE
from llmbuild.op_defs.slice import SLICE
from llmbuild.op_defs.softmax import SOFTMAX

__all__ = ["BY_NAME", "COSTS", "GROUPINGS", "OPS", "REAL_ROWS", "SPEC_KERNELS", "Kernel", "OpDef", "TopForm",
           "spec_kernels", "with_attrs"]

OPS: tuple[OpDef, ...] = (
    GATHER, RMS_NORM, MATMUL, A16_MATMUL, A16_GATHER, RESHAPE, PERMUTE, ROPE, FATTENTION, CONCAT, ADD, MUL,
    ACTIVE, SOFTMAX, CAST, LAYER_NORM, SLICE, L2_NORM, CAUSAL_CONV1D, GATED_DELTA_RULE,
)
BY_NAME = {op.name: op for op in OPS}


def spec_kernels(defs: Iterable[OpDef]) -> dict[str, Kernel]:
    """The spec kernel of every tpu op and every top op of `defs`, keyed by the op's name without its dialect
    (a top form runs its tpu op's spec with the attributes its lowering sets: top.SiLU is Active SILU)."""
    table: dict[str, Kernel] = {}
    for op in defs:
        table[op.name] = op.spec
        for form in op.top_forms():
            table[form.name] = with_attrs(op.spec, form.lowering_attrs) if form.lowering_attrs else op.spec
    return table


SPEC_KERNELS = spec_kernels(OPS)

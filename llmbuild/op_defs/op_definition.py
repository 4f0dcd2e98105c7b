"""What defines a compute op: one `OpDef`, pure data and a plain numpy kernel (no xDSL, no compiler).

Every other piece of an op is derived from its definition by the layer that needs it: the `top` and `tpu`
classes (`dialects/from_definitions.py`, on the irdl base `dialects/common.<shape>Base`), the lowering
(`passes/lower_top_to_tpu.TOP_TO_TPU`), the opcode (`binary/program.OPCODES`), the grouping
(`passes/layer_group_plan.ROW_LOCAL`), the cost (`cost/group_timing`) and the host's kernel table
(`numerics/kernels.KERNELS`: the spec kernel, unless the host has an optimised kernel of its own).
`llmbuild/op_registry.py` checks that each derived piece exists, and that an `exported` op has its
hand-written translation to the vendor's top dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A kernel takes a dict of plain attributes and the operands (arrays in the compute dtype: float64 for the
# reference, float32 on the device) and returns the result in the same compute dtype.
Kernel = Callable[..., np.ndarray]

GROUPINGS = ("row_local", "attention", "concat", "whole")  # row by row, flash attention, the key block's concat
# MAC work, attention's own rule, vector work, nothing, a linear-attention recurrence's own rule
COSTS = ("mac", "attention", "vector", "view", "recurrence")
# What an executor given the count of real tokens (`active_rows`, the rest padding) may compute: every row;
# the real rows only, zeros after them ("local": a row's result depends on that row alone, and a product
# that reads it gets the same bits either way); or the row tiles that hold real tokens, zeros after them
# ("skipping": ops whose cost grows with the rows).
REAL_ROWS = ("all", "local", "skipping")


@dataclass(frozen=True)
class TopForm:
    """A `top` op lowered to the definition's `tpu` op."""

    name: str  # the top op, e.g. "SiLU" for top.SiLU
    shape: str  # the irdl base in dialects/common.py, without "Base"
    summary: str
    example: str  # one line of `.mlir`
    lowering_attrs: Mapping[str, str] = field(default_factory=dict)  # string attributes the lowering sets
    exported: bool = True  # it has a vendor translation (see OpDef.exported), when its op has


@dataclass(frozen=True)
class OpDef:
    """One compute op: the `tpu` op (and, by default, a `top` op of the same name and shape)."""

    name: str  # the tpu op and its opcode name, e.g. "MatMul" for tpu.MatMul
    opcode: int  # its number in the binary: never reuse or renumber one (every `.llmb` holds them)
    summary: str
    example: str  # one line of `.mlir`, as the op appears after lowering
    shape: str  # the irdl base in dialects/common.py (operands, attributes, verifier), without "Base"
    grouping: str  # GROUPINGS
    cost: str  # COSTS; "mac" is a product of an activation by a weight (the planner tiles and streams it)
    spec: Kernel  # the plain numpy semantics: the reference interpreter runs it, the checks compare to it
    vector_ops: int = 0  # vector operations per output element, when `cost` is "vector"
    real_rows: str = "all"  # REAL_ROWS
    # Whether its top forms have a form in the vendor's top dialect (bmodel/top_export.py, bmodel/vit_export.py
    # export each): False for an op that only the .llmb carries, whose nets then build no .bmodel.
    exported: bool = True
    moves_data: bool = False  # it only moves data: the lowering keeps its float input's precision
    tops: tuple[TopForm, ...] | None = None  # None: one top op of the same name, shape and summary

    def top_forms(self) -> tuple[TopForm, ...]:
        if self.tops is not None:
            return self.tops
        example = self.example.replace('"tpu.', '"top.').replace("xbf16", "xf32")
        return (TopForm(self.name, self.shape, self.summary, example),)

    def doc(self) -> str:
        return docstring(self.summary, self.example)

    def names(self) -> tuple[str, ...]:
        """The tpu op's name and its top forms' (top.SiLU is a form of Active)."""
        return (self.name, *(form.name for form in self.top_forms() if form.name != self.name))


def docstring(summary: str, example: str) -> str:
    return f"{summary}\n\nExample:\n\n    {example}\n"


def with_attrs(spec: Kernel, fixed: Mapping[str, Any]) -> Kernel:
    """`spec` with attributes the top form implies (top.SiLU is tpu.Active with mode SILU)."""

    def kernel(attrs: dict[str, Any], *operands: np.ndarray) -> np.ndarray:
        return spec({**attrs, **fixed}, *operands)

    return kernel

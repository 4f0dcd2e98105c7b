"""Every compute op in one table, and the check that each has all its pieces.

An op of this compiler lives in several places, each owned by the layer that needs it: its `top` and
`tpu` definitions (`dialects/top.py`, `dialects/tpu.py`, shapes and verifiers shared in `dialects/common.py`),
its lowering (`passes/lower_top_to_tpu.TOP_TO_TPU`), its opcode in the binary (`binary/program.OPCODES`), its
numpy kernel, which the interpreter, the device simulator and the host path all run
(`numerics/kernels.KERNELS`), how the layer-group pass may group it (`passes/layer_group_plan.ROW_LOCAL`,
or its own rule), and how the cost model times it (`cost/group_timing`). `OPS` names them all;
`missing_pieces` lists what an op lacks, and tests/test_op_registry.py fails on any. docs/design.md,
"Adding an op", is the list to follow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

GROUPINGS = ("row_local", "attention", "concat", "whole")
COSTS = ("mac", "attention", "vector", "view")


@dataclass(frozen=True)
class OpDef:
    name: str  # the tpu op and its opcode, e.g. "MatMul" for tpu.MatMul
    summary: str
    example: str  # one line of `.mlir`, as the op appears after lowering
    top: str | None  # the top op lowered to it ("SiLU" for Active); None: made by the lowering itself (Cast)
    grouping: str  # GROUPINGS: row by row (row_local), flash attention, the key block's concat, or whole
    cost: str  # COSTS: MAC work, attention's own rule, vector work per element, or nothing (a view)
    also_from: tuple[str, ...] = ()  # other top ops lowered to it (GELU for Active, with its own mode)


OPS: tuple[OpDef, ...] = (
    OpDef("Gather", "Rows of a table by index: the embedding lookup, the RoPE tables, act order's permutation.",
          '%e = "tpu.Gather"(%table, %ids) {axis = 0 : i64} : (tensor<512x64xf32>, tensor<1x16xi32>) -> '
          "tensor<1x16x64xf32>", "Gather", "row_local", "vector"),
    OpDef("RMSNorm", "x / sqrt(mean(x^2) + eps) * gamma over the last axis.",
          '%y = "tpu.RMSNorm"(%x, %g) {eps = 1.0e-06 : f64} : (tensor<1x16x64xbf16>, tensor<64xbf16>) -> '
          "tensor<1x16x64xbf16>", "RMSNorm", "row_local", "vector"),
    OpDef("MatMul", "x @ W (+ bias) over the last axis; W is [K, N], or [N, K] transposed.",
          '%y = "tpu.MatMul"(%x, %w) {right_transpose = true} : (tensor<1x16x64xbf16>, tensor<128x64xbf16>) '
          "-> tensor<1x16x128xbf16>", "MatMul", "row_local", "mac"),
    OpDef("A16MatMul", "x @ dequant(W)^T (+ bias): 4- or 8-bit weights in groups, 16-bit activations.",
          '%y = "tpu.A16MatMul"(%x, %q, %s, %z) {bits = 4 : i64, group_size = 64 : i64} : (...) -> '
          "tensor<1x16x128xbf16>", "A16MatMul", "row_local", "mac"),
    OpDef("A16Gather", "Rows of a quantized table by index (a w4/w8 embedding), dequantized.",
          '%e = "tpu.A16Gather"(%q, %s, %z, %ids) {bits = 8 : i64, group_size = 64 : i64} : (...) -> '
          "tensor<1x16x64xbf16>", "A16Gather", "row_local", "vector"),
    OpDef("Reshape", "The same elements in another shape (a view when assign-address aliases it).",
          '%r = "tpu.Reshape"(%x) {shape = array<i64: 1, 16, 4, 16>} : (tensor<1x16x64xbf16>) -> '
          "tensor<1x16x4x16xbf16>", "Reshape", "row_local", "view"),
    OpDef("Permute", "Axes in another order.",
          '%p = "tpu.Permute"(%x) {order = array<i64: 0, 2, 1, 3>} : (tensor<1x16x4x16xbf16>) -> '
          "tensor<1x4x16x16xbf16>", "Permute", "whole", "vector"),
    OpDef("Rope", "Rotary position embedding, rotate-half form: x * cos + rotate_half(x) * sin.",
          '%q = "tpu.Rope"(%x, %cos, %sin) : (tensor<1x16x4x16xbf16>, ...) -> tensor<1x16x4x16xbf16>',
          "Rope", "row_local", "vector"),
    OpDef("FAttention", "Grouped-query attention softmax(q k^T * scale + mask) v, in key blocks when long.",
          '%a = "tpu.FAttention"(%q, %k, %v, %mask) {scale = 0.25 : f64, q_head = 4 : i64, kv_head = 2 : i64} '
          ": (...) -> tensor<1x16x64xbf16>", "FAttention", "attention", "attention"),
    OpDef("Concat", "Tensors joined along an axis: the KV history and the new rows.",
          '%k = "tpu.Concat"(%hk, %kn) {axis = 1 : i64} : (tensor<1x48x2x16xbf16>, tensor<1x16x2x16xbf16>) -> '
          "tensor<1x64x2x16xbf16>", "Concat", "concat", "vector"),
    OpDef("Add", "Elementwise sum with broadcasting: residuals, the attention mask.",
          '%s = "tpu.Add"(%a, %b) : (tensor<1x16x64xbf16>, tensor<1x16x64xbf16>) -> tensor<1x16x64xbf16>',
          "Add", "row_local", "vector"),
    OpDef("Mul", "Elementwise product with broadcasting: the gated MLP.",
          '%m = "tpu.Mul"(%a, %b) : (tensor<1x16x128xbf16>, tensor<1x16x128xbf16>) -> tensor<1x16x128xbf16>',
          "Mul", "row_local", "vector"),
    OpDef("Active", "An activation chosen by mode (TPU-MLIR's Active): SILU from top.SiLU, GELU from top.GELU, "
          "GELU_TANH from top.GELUTanh.",
          '%g = "tpu.Active"(%x) {mode = "SILU"} : (tensor<1x16x128xbf16>) -> tensor<1x16x128xbf16>',
          "SiLU", "row_local", "vector", also_from=("GELU", "GELUTanh")),
    OpDef("Softmax", "softmax over an axis.",
          '%p = "tpu.Softmax"(%x) {axis = -1 : i64} : (tensor<1x4x16x64xf32>) -> tensor<1x4x16x64xf32>',
          "Softmax", "whole", "vector"),
    OpDef("Cast", "Element type conversion, round to nearest even; inserted by the lowering.",
          '%c = "tpu.Cast"(%x) : (tensor<1x16x64xbf16>) -> tensor<1x16x64xf32>', None, "row_local", "vector"),
    OpDef("LayerNorm", "(x - mean) / sqrt(var + eps) * gamma + beta over the last axis: the vision towers' norm.",
          '%y = "tpu.LayerNorm"(%x, %g, %b) {eps = 1.0e-06 : f64} : (tensor<1x1025x1024xbf16>, ...) -> '
          "tensor<1x1025x1024xbf16>", "LayerNorm", "row_local", "vector"),
    OpDef("Slice", "Rows start:end of one axis: a vision tower's output without its class token.",
          '%s = "tpu.Slice"(%x) {axis = 1 : i64, start = 1 : i64, end = 1025 : i64} : (tensor<1x1025x1024xbf16>) '
          "-> tensor<1x1024x1024xbf16>", "Slice", "whole", "vector"),
)
BY_NAME = {op.name: op for op in OPS}


@dataclass(frozen=True)
class Pieces:
    """The places an op's pieces live, as the code has them (`current_pieces`); a test removes one."""

    top_ops: Mapping[str, type]  # "top.X" -> class
    tpu_ops: Mapping[str, type]  # "tpu.X" -> class
    lowering: Mapping[str, type]  # "top.X" -> tpu class
    opcodes: Mapping[str, int]
    kernels: Mapping[str, object]
    row_local: frozenset[str]  # "tpu.X" the layer-group planner tiles by rows
    mac_ops: tuple[str, ...]
    vector_ops: Mapping[str, int]  # vector operations per output element
    attention_ops: tuple[str, ...]


def current_pieces() -> Pieces:
    from llmbuild.binary.program import OPCODE_OF
    from llmbuild.cost import group_timing
    from llmbuild.dialects import top, tpu
    from llmbuild.numerics.kernels import KERNELS
    from llmbuild.passes.layer_group_plan import ROW_LOCAL
    from llmbuild.passes.lower_top_to_tpu import TOP_TO_TPU

    return Pieces(
        top_ops={op.name: op for op in top.Top.operations},
        tpu_ops={op.name: op for op in tpu.Tpu.operations},
        lowering=dict(TOP_TO_TPU),
        opcodes=dict(OPCODE_OF),
        kernels=dict(KERNELS),
        row_local=frozenset(ROW_LOCAL),
        mac_ops=tuple(group_timing.MAC_OPS),
        vector_ops=dict(group_timing.EU_OPS_PER_ELEMENT),
        attention_ops=tuple(group_timing.ATTENTION_OPS),
    )


def missing_pieces(op: OpDef, pieces: Pieces) -> list[str]:
    """What `op` lacks, one short phrase each; [] when it is complete."""
    missing = []
    tpu_name = f"tpu.{op.name}"
    tpu_class = pieces.tpu_ops.get(tpu_name)
    if tpu_class is None:
        missing.append(f"{tpu_name} in dialects/tpu.py")
    elif tpu_class.__doc__ is None:
        missing.append(f"a docstring on {tpu_name}")
    for source in ((op.top,) if op.top is not None else ()) + op.also_from:
        top_name = f"top.{source}"
        top_class = pieces.top_ops.get(top_name)
        if top_class is None:
            missing.append(f"{top_name} in dialects/top.py")
        elif top_class.__doc__ is None:
            missing.append(f"a docstring on {top_name}")
        if tpu_class is not None and pieces.lowering.get(top_name) is not tpu_class:
            missing.append(f"the lowering {top_name} -> {tpu_name} in passes/lower_top_to_tpu.py")
        if source not in pieces.kernels:
            missing.append(f"the kernel {source!r} (the interpreter runs top ops) in numerics/kernels.py")
    if op.name not in pieces.opcodes:
        missing.append(f"an opcode for {op.name} in binary/program.py")
    if op.name not in pieces.kernels:
        missing.append(f"the kernel {op.name!r} in numerics/kernels.py")
    if op.grouping not in GROUPINGS:
        missing.append(f"a grouping among {', '.join(GROUPINGS)}")
    elif (op.grouping == "row_local") != (tpu_name in pieces.row_local):
        where = "in" if op.grouping == "row_local" else "out of"
        missing.append(f"{tpu_name} {where} ROW_LOCAL in passes/layer_group_plan.py")
    cost_table = {"mac": op.name in pieces.mac_ops, "attention": op.name in pieces.attention_ops,
                  "vector": op.name in pieces.vector_ops, "view": pieces.vector_ops.get(op.name) == 0}
    if not cost_table.get(op.cost, False):
        missing.append(f"the {op.cost} cost of {op.name} in cost/group_timing.py")
    return missing

"""An op is one definition (llmbuild/op_defs/): every piece is derived from it and the registry check
(llmbuild/op_registry.py) finds each one; an op added from a single definition gets every piece; and the
check names the piece when any one is removed."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.func import Func
from xdsl.ir import Dialect
from xdsl.parser import Parser

from llmbuild.binary import program
from llmbuild.bmodel.top_export import NetExporter
from llmbuild.dialects import top
from llmbuild.numerics import kernels
from llmbuild.op_defs import OpDef
from llmbuild.op_registry import OPS, current_pieces, derived_pieces, missing_pieces
from llmbuild.passes import lower_top_to_tpu

STRUCTURE = {"tpu.Group", "tpu.Load", "tpu.Store", "tpu.Yield", "top.Input", "top.Weight"}


def _square(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    return x * x


# A test-only op, defined once as a new op would be: nothing else in the code names it.
SQUARE = OpDef(
    "Square", len(program.OPCODES) + 1, "x * x, elementwise.",
    '%y = "tpu.Square"(%x) : (tensor<1x16x64xbf16>) -> tensor<1x16x64xbf16>',
    shape="Unary", grouping="row_local", cost="vector", vector_ops=1, spec=_square, exported=False,
)


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_every_op_has_every_piece(op) -> None:
    assert missing_pieces(op, current_pieces()) == []


def test_the_code_uses_the_pieces_derived_from_the_definitions() -> None:
    now, derived = current_pieces(), derived_pieces(OPS)
    assert now.lowering.keys() == derived.lowering.keys()
    assert {k: v.name for k, v in now.lowering.items()} == {k: v.name for k, v in derived.lowering.items()}
    for field in ("opcodes", "kernels", "spec_kernels", "row_local", "mac_ops", "vector_ops", "attention_ops"):
        got, want = getattr(now, field), getattr(derived, field)
        assert (got.keys() if isinstance(got, dict) else got) == (want.keys() if isinstance(want, dict) else want)


def test_every_op_of_the_dialects_and_the_binary_is_registered() -> None:
    pieces = current_pieces()
    names = {op.name for op in OPS}
    assert {n.split(".")[1] for n in pieces.tpu_ops if n not in STRUCTURE} == names
    assert {n.split(".")[1] for n in pieces.top_ops if n not in STRUCTURE} == {
        form.name for op in OPS for form in op.top_forms()}
    assert set(pieces.opcodes) - set(program.MEMORY_OPCODES) == names


def test_opcodes_are_the_ones_every_binary_holds() -> None:
    assert program.OPCODES == (
        "Gather", "RMSNorm", "MatMul", "Reshape", "Permute", "Rope", "FAttention", "Concat", "Add", "Mul",
        "Active", "Softmax", "Cast", "A16MatMul", "Load", "Store", "A16Gather", "LayerNorm", "Slice", "L2Norm",
            "CausalConv1d", "GatedDeltaRule")
    with pytest.raises(Exception, match="opcodes must be"):
        program.opcode_table(OPS + (dataclasses.replace(SQUARE, opcode=3),))


def test_an_op_added_from_one_definition_gets_every_piece() -> None:
    pieces = derived_pieces(OPS + (SQUARE,))
    assert missing_pieces(SQUARE, pieces) == []
    top_square, tpu_square = pieces.top_ops["top.Square"], pieces.tpu_ops["tpu.Square"]
    assert (top_square.name, tpu_square.name) == ("top.Square", "tpu.Square")
    assert "x * x" in tpu_square.__doc__ and '"top.Square"(%x)' in top_square.__doc__
    assert pieces.lowering["top.Square"] is tpu_square
    assert pieces.opcodes["Square"] == len(program.OPCODES) + 1
    assert pieces.kernels["Square"] is _square and pieces.spec_kernels["Square"] is _square
    assert "tpu.Square" in pieces.row_local and pieces.vector_ops["Square"] == 1
    for op in OPS:  # the ops that were there keep their pieces
        assert missing_pieces(op, pieces) == []


def test_an_added_op_parses_verifies_and_lowers(monkeypatch: pytest.MonkeyPatch) -> None:
    pieces = derived_pieces(OPS + (SQUARE,))
    ctx = Context()
    for dialect in (Builtin, Func, Dialect("top", [top.InputOp, top.WeightOp, *pieces.top_ops.values()], []),
                    Dialect("tpu", list(pieces.tpu_ops.values()), [])):
        ctx.load_dialect(dialect)
    text = ('builtin.module attributes {} {\n  func.func @main(%x: tensor<1x4xf32>) -> tensor<1x4xf32> '
            'attributes {arg_names = ["x"], result_names = ["y"]} {\n'
            '    %y = "top.Square"(%x) : (tensor<1x4xf32>) -> tensor<1x4xf32>\n'
            '    func.return %y : tensor<1x4xf32>\n  }\n}\n')
    module = Parser(ctx, text).parse_module()
    module.verify()
    monkeypatch.setattr(lower_top_to_tpu, "TOP_TO_TPU", pieces.lowering)
    lower_top_to_tpu.LowerTopToTpu(mode="f32").apply(ctx, module)
    module.verify()
    assert [op.name for op in module.walk() if op.name.endswith("Square")] == ["tpu.Square"]
    bad = text.replace("-> tensor<1x4xf32>\n    func", "-> tensor<1x5xf32>\n    func").replace(
        "-> tensor<1x4xf32> attributes", "-> tensor<1x5xf32> attributes").replace(": tensor<1x4xf32>\n  }",
                                                                                  ": tensor<1x5xf32>\n  }")
    with pytest.raises(Exception, match="output shape must equal input"):
        Parser(ctx, bad).parse_module().verify()


def _without(pieces, field: str, key):
    value = getattr(pieces, field)
    if isinstance(value, (frozenset, tuple)):
        return dataclasses.replace(pieces, **{field: type(value)(v for v in value if v != key)})
    return dataclasses.replace(pieces, **{field: {k: v for k, v in value.items() if k != key}})


@pytest.mark.parametrize(("field", "key", "words"), [
    ("top_ops", "top.Square", "top.Square in dialects/top.py"),
    ("tpu_ops", "tpu.Square", "tpu.Square in dialects/tpu.py"),
    ("lowering", "top.Square", "the lowering top.Square -> tpu.Square"),
    ("opcodes", "Square", f"the opcode {SQUARE.opcode} of Square"),
    ("kernels", "Square", "the kernel 'Square' in numerics/kernels.KERNELS"),
    ("spec_kernels", "Square", "the spec kernel 'Square'"),
    ("row_local", "tpu.Square", "tpu.Square in ROW_LOCAL"),
    ("vector_ops", "Square", "the vector cost of Square"),
])
def test_the_check_names_each_piece_of_an_added_op_removed(field: str, key: str, words: str) -> None:
    assert {f.name for f in dataclasses.fields(current_pieces())} >= {field}
    missing = missing_pieces(SQUARE, _without(derived_pieces(OPS + (SQUARE,)), field, key))
    assert any(words in m for m in missing), missing


def test_every_piece_of_an_added_op_is_checked() -> None:
    """Each field of Pieces that holds a piece of Square, removed, makes the check fail."""
    pieces = derived_pieces(OPS + (SQUARE,))
    for field in dataclasses.fields(pieces):
        value = getattr(pieces, field.name)
        keys = [k for k in value if "Square" in k]
        if field.name in ("mac_ops", "attention_ops", "recurrence_ops", "vendor_exports"):
            continue  # Square is a vector op the vendor's top dialect does not have: no entry to remove there
        assert keys, field.name
        for key in keys:
            assert missing_pieces(SQUARE, _without(pieces, field.name, key)), (field.name, key)


@pytest.mark.parametrize(("module", "table", "key", "op", "words"), [
    (lower_top_to_tpu, "TOP_TO_TPU", "top.Rope", "Rope", "the lowering top.Rope -> tpu.Rope"),
    (lower_top_to_tpu, "TOP_TO_TPU", "top.SiLU", "Active", "the lowering top.SiLU -> tpu.Active"),
    (program, "OPCODE_OF", "Concat", "Concat", "the opcode 8 of Concat"),
    (kernels, "KERNELS", "RMSNorm", "RMSNorm", "the kernel 'RMSNorm'"),
    (kernels, "KERNELS", "SiLU", "Active", "the kernel 'SiLU'"),
    (kernels, "KERNELS", "A16MatMul", "A16MatMul", "the kernel 'A16MatMul'"),
])
def test_the_check_notices_a_piece_removed_from_the_code(monkeypatch: pytest.MonkeyPatch, module, table: str,
                                                         key: str, op: str, words: str) -> None:
    monkeypatch.delitem(getattr(module, table), key)
    missing = missing_pieces(next(o for o in OPS if o.name == op), current_pieces())
    assert any(words in m for m in missing), missing


@pytest.mark.parametrize(("field", "key", "op", "words"), [
    ("row_local", "tpu.Add", "Add", "tpu.Add in ROW_LOCAL"),
    ("mac_ops", "A16MatMul", "A16MatMul", "the mac cost of A16MatMul"),
    ("vector_ops", "Cast", "Cast", "the vector cost of Cast"),
    ("attention_ops", "FAttention", "FAttention", "the attention cost of FAttention"),
    ("top_ops", "top.SiLU", "Active", "top.SiLU in dialects/top.py"),
    ("tpu_ops", "tpu.MatMul", "MatMul", "tpu.MatMul in dialects/tpu.py"),
])
def test_the_check_notices_a_missing_piece(field: str, key: str, op: str, words: str) -> None:
    op_def = next(o for o in OPS if o.name == op)
    missing = missing_pieces(op_def, _without(current_pieces(), field, key))
    assert any(words in m for m in missing), missing


def test_an_exported_op_needs_its_vendor_translation(monkeypatch: pytest.MonkeyPatch) -> None:
    """An op said to have a vendor form but without one is named; so is one whose translation is removed."""
    pieces = derived_pieces(OPS + (SQUARE,))
    missing = missing_pieces(dataclasses.replace(SQUARE, exported=True), pieces)
    assert any("the vendor export op_Square" in m for m in missing), missing
    assert missing_pieces(SQUARE, pieces) == []
    monkeypatch.delattr(NetExporter, "op_Rope")
    missing = missing_pieces(next(o for o in OPS if o.name == "Rope"), current_pieces())
    assert any("the vendor export op_Rope" in m for m in missing), missing


class _Undocumented:  # a class without a docstring stands in for an op class that lost its own
    pass


def test_the_check_notices_a_missing_docstring() -> None:
    pieces = current_pieces()
    tpu_ops = dict(pieces.tpu_ops, **{"tpu.Mul": _Undocumented})
    missing = missing_pieces(next(o for o in OPS if o.name == "Mul"), dataclasses.replace(pieces, tpu_ops=tpu_ops))
    assert "a docstring on tpu.Mul" in missing

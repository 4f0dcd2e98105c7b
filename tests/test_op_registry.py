"""Every op has all its pieces (llmbuild/op_registry.py): top and tpu definitions with docstrings, the
lowering, the opcode, the kernel, the grouping rule and the cost; and the check notices any one removed."""

from __future__ import annotations

import dataclasses

import pytest

from llmbuild.op_registry import OPS, current_pieces, missing_pieces

STRUCTURE = {"tpu.Group", "tpu.Load", "tpu.Store", "tpu.Yield", "top.Input", "top.Weight"}


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_every_op_has_every_piece(op) -> None:
    assert missing_pieces(op, current_pieces()) == []


def test_every_op_of_the_dialects_and_the_binary_is_registered() -> None:
    pieces = current_pieces()
    names = {op.name for op in OPS}
    assert {n.split(".")[1] for n in pieces.tpu_ops if n not in STRUCTURE} == names
    assert {n.split(".")[1] for n in pieces.top_ops if n not in STRUCTURE} == {
        t for op in OPS for t in ((op.top,) if op.top else ()) + op.also_from}
    assert set(pieces.opcodes) - {"Load", "Store"} == names


def _without(pieces, field: str, key):
    value = getattr(pieces, field)
    if isinstance(value, (frozenset, tuple)):
        return dataclasses.replace(pieces, **{field: type(value)(v for v in value if v != key)})
    return dataclasses.replace(pieces, **{field: {k: v for k, v in value.items() if k != key}})


class _Undocumented:  # a class without a docstring stands in for an op class that lost its own
    pass


@pytest.mark.parametrize(("field", "key", "op", "words"), [
    ("tpu_ops", "tpu.MatMul", "MatMul", "tpu.MatMul in dialects/tpu.py"),
    ("top_ops", "top.SiLU", "Active", "top.SiLU in dialects/top.py"),
    ("lowering", "top.Rope", "Rope", "the lowering top.Rope -> tpu.Rope"),
    ("opcodes", "Concat", "Concat", "an opcode for Concat"),
    ("kernels", "RMSNorm", "RMSNorm", "the kernel 'RMSNorm'"),
    ("kernels", "SiLU", "Active", "the kernel 'SiLU'"),
    ("row_local", "tpu.Add", "Add", "tpu.Add in ROW_LOCAL"),
    ("mac_ops", "A16MatMul", "A16MatMul", "the mac cost of A16MatMul"),
    ("vector_ops", "Cast", "Cast", "the vector cost of Cast"),
    ("attention_ops", "FAttention", "FAttention", "the attention cost of FAttention"),
])
def test_the_check_notices_a_missing_piece(field: str, key: str, op: str, words: str) -> None:
    op_def = next(o for o in OPS if o.name == op)
    missing = missing_pieces(op_def, _without(current_pieces(), field, key))
    assert any(words in m for m in missing), missing


def test_the_check_notices_a_missing_docstring() -> None:
    pieces = current_pieces()
    tpu_ops = dict(pieces.tpu_ops, **{"tpu.Mul": _Undocumented})
    missing = missing_pieces(next(o for o in OPS if o.name == "Mul"), dataclasses.replace(pieces, tpu_ops=tpu_ops))
    assert "a docstring on tpu.Mul" in missing

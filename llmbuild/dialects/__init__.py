"""The `top` and `tpu` dialects, and reading and writing `.mlir` text with them."""

from __future__ import annotations

import io
from pathlib import Path

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.dialects.func import Func
from xdsl.parser import Parser
from xdsl.printer import Printer

from llmbuild import LlmbuildError
from llmbuild.dialects.top import Top
from llmbuild.dialects.tpu import Tpu


def make_context() -> Context:
    ctx = Context()
    for dialect in (Builtin, Func, Top, Tpu):
        ctx.load_dialect(dialect)
    return ctx


def module_text(module: ModuleOp) -> str:
    """The generic MLIR form: what upstream `mlir-opt --allow-unregistered-dialect` reads."""
    out = io.StringIO()
    Printer(stream=out, print_generic_format=True).print_op(module)
    out.write("\n")
    return out.getvalue()


def parse_module_text(text: str, origin: str = "<string>") -> ModuleOp:
    try:
        module = Parser(make_context(), text, origin).parse_module()
        module.verify()
    except Exception as exc:  # xDSL raises several exception types; the user needs one line
        # xDSL's messages span lines (location, source excerpt, reason): keep all of it on one line.
        reason = " ".join(part.strip() for part in str(exc).splitlines() if part.strip() and set(part.strip()) != {"^"})
        raise LlmbuildError(f"{origin}: not a valid top/tpu module: {reason}") from None
    return module


def read_module(path: Path) -> ModuleOp:
    return parse_module_text(path.read_text(), str(path))

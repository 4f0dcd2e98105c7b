"""Values that know where they came from: each recipe value keeps its file and line, and every error
is one line `<file>:<line>: <dotted.field>: expected <what>, got <what>`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError


@dataclass(frozen=True)
class Loc:
    file: Path
    line: int

    def __str__(self) -> str:
        return f"{display_path(self.file)}:{self.line}"


@dataclass
class Node:
    """A YAML value with its origin. Mapping values are dict[str, Node], sequences list[Node]."""

    value: Any
    loc: Loc


def display_path(path: Path) -> str:
    # Paths under the working directory are shown relative, as a user would type them.
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def located_error(loc: Loc, field: str, message: str) -> LlmbuildError:
    text = f"{loc}: {field}: {message}" if field else f"{loc}: {message}"
    return LlmbuildError(" ".join(text.split("\n")))


def describe_value(value: Any) -> str:
    """A value as an error message shows it after 'got'."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"number {value}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        shown = json.dumps(value, default=str)
        return f"list {shown}" if len(shown) <= 60 else f"a list of {len(value)} items"
    return type(value).__name__

def plain_value(node: Node) -> Any:
    if isinstance(node.value, dict):
        return {k: plain_value(v) for k, v in node.value.items()}
    if isinstance(node.value, list):
        return [plain_value(v) for v in node.value]
    return node.value

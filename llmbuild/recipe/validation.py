"""Validation against the schema table (recipe/schema_table.py): unknown keys (with a difflib hint),
types, constraints and defaults, section by section.
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass
from typing import Any

from llmbuild.recipe import schema_table as st
from llmbuild.recipe.inheritance import DIRECTIVES
from llmbuild.recipe.nodes import Node, describe_value, located_error, plain_value


@dataclass
class Checked:
    raw: dict[str, Any]
    given: dict[str, Node]  # dotted path -> node, for every schema field set in the files
    sections: dict[str, Node]  # dotted path -> node of each section mapping (given or not)




def check_section(section: str, node: Node, out: Checked) -> dict[str, Any]:
    specs = {f.key: f for f in st.children(section)}
    out.sections[section] = node
    for key, child in node.value.items():
        if key not in specs:
            field = f"{section}.{key}" if section else key
            close = difflib.get_close_matches(key, list(specs), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise located_error(child.loc, field, f"expected one of the keys {', '.join(specs)}, got unknown "
                                                  f"key {key!r}{hint}")
    result: dict[str, Any] = {}
    for key, spec in specs.items():
        if spec.path in DIRECTIVES:
            continue
        child = node.value.get(key)
        if child is None or child.value is None:  # null means unset: the default applies
            result[key] = _missing(spec, node, out)
        else:
            out.given[spec.path] = child
            result[key] = _check_field(spec, child, out)
    return result


def _missing(spec: st.FieldSpec, parent: Node, out: Checked) -> Any:
    if spec.required:
        raise located_error(parent.loc, spec.path, f"expected {spec.expected()}, got nothing (a required field)")
    if spec.type == "section":
        return check_section(spec.path, Node({}, parent.loc), out)
    return copy.deepcopy(spec.default) if spec.has_default else None


def _check_field(spec: st.FieldSpec, node: Node, out: Checked) -> Any:
    if spec.type == "section":
        if not isinstance(node.value, dict):
            raise located_error(node.loc, spec.path, f"expected a mapping, got {describe_value(node.value)}")
        return check_section(spec.path, node, out)
    value = plain_value(node)
    if not st.type_ok(spec.type, value):
        if spec.type == "list[int]" and isinstance(node.value, list):
            # Point at the offending item, not the list.
            bad = next(i for i, v in enumerate(node.value) if not st.type_ok("integer", v.value))
            raise located_error(node.value[bad].loc, f"{spec.path}[{bad}]",
                                f"expected an integer, got {describe_value(node.value[bad].value)}")
        raise located_error(node.loc, spec.path, f"expected {st.TYPE_WORDS[spec.type]}, got {describe_value(value)}")
    if spec.type == "number":
        value = float(value)
    if spec.constraint is not None and not spec.constraint.ok(value):
        shown = node.value if spec.type != "list[int]" else value
        raise located_error(node.loc, spec.path, f"expected {spec.expected()}, got {describe_value(shown)}")
    return value

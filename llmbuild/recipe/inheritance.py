"""`base:` inheritance: a recipe's files read and merged (mappings key by key, anything else replaced),
each value keeping the file it came from.
"""

from __future__ import annotations

from pathlib import Path

from llmbuild.recipe.nodes import Node, describe_value, display_path, located_error, plain_value
from llmbuild.recipe.yaml_reader import read_yaml

# Top-level keys acted on while reading the files; they are not part of the merged recipe.
DIRECTIVES = frozenset({"base"})


def load_tree(path: Path, chain: tuple[Path, ...] = ()) -> Node:
    """Read `path` and everything it inherits, merged; `chain` holds the files that inherit it."""
    node = read_yaml(path)
    if not isinstance(node.value, dict):
        got = describe_value(plain_value(node))
        raise located_error(node.loc, "", f"expected a mapping of recipe fields, got {got}")
    quant = node.value.get("quantization")
    if quant is not None and quant.value == "auto":  # `quantization: auto` is `quantization: {mode: auto}`
        node.value["quantization"] = Node({"mode": Node("auto", quant.loc)}, quant.loc)
    base = node.value.pop("base", None)
    if base is None or base.value is None:
        return node
    name = base.value
    if not isinstance(name, str) or not name or "/" in name or "\\" in name:
        raise located_error(base.loc, "base", f"expected the name of a recipe in {display_path(path.parent)}, "
                                              f"got {describe_value(name)}")
    name = name.removesuffix(".yaml")
    base_path = path.parent / f"{name}.yaml"
    here = (*chain, path.resolve())
    if base_path.resolve() in here:
        cycle = " -> ".join([p.stem for p in here] + [name])
        raise located_error(base.loc, "base", f"expected a recipe that does not inherit from itself, got the "
                                              f"cycle {cycle}")
    if not base_path.is_file():
        raise located_error(base.loc, "base", f"expected a recipe in {display_path(path.parent)}, got {name!r} "
                                              f"(no file {display_path(base_path)})")
    return _merge(load_tree(base_path, here), node)


def _merge(base: Node, child: Node) -> Node:
    """Deep merge: mappings merge key by key, anything else (lists, scalars, null) replaces."""
    if not (isinstance(base.value, dict) and isinstance(child.value, dict)):
        return child
    merged = dict(base.value)
    for key, value in child.value.items():
        merged[key] = _merge(merged[key], value) if key in merged else value
    return Node(merged, child.loc)

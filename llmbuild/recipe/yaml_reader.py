"""Safe YAML into located nodes: plain mappings, lists and scalars only (no tags, no Python objects),
with bounds on depth and size that stop alias bombs and recursive anchors early.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from llmbuild import LlmbuildError
from llmbuild.recipe.nodes import Loc, Node, describe_value, display_path, located_error

# A recipe is a few dozen values; these bounds stop alias bombs and recursive anchors early.
_MAX_DEPTH = 32


_MAX_VALUES = 100_000


class _SafeLoader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-6` as a float (YAML 1.1 would make it a string)."""


_SafeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


_PLAIN_TAGS = frozenset({"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"})


def read_yaml(path: Path) -> Node:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LlmbuildError(f"{display_path(path)}: cannot read recipe: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - data.rfind(b"\n", 0, exc.start)
        raise located_error(Loc(path, line), "", f"expected UTF-8 text, got byte {data[exc.start]:#04x} at column "
                                                 f"{column}") from None
    loader = None
    try:
        loader = _SafeLoader(text)  # may already refuse the text (non-printable characters)
        root = loader.get_single_node()
        if root is None:
            raise located_error(Loc(path, 1), "", "expected a mapping of recipe fields, got an empty file")
        return _to_node(loader, root, Loc(path, root.start_mark.line + 1), "", 0, [0])
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        what = exc.problem or exc.context or "a YAML error"
        raise located_error(Loc(path, line), "", f"expected valid YAML, got {what}") from None
    except yaml.YAMLError as exc:
        raise located_error(Loc(path, 1), "", f"expected valid YAML, got {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _to_node(loader: yaml.SafeLoader, yn: yaml.Node, loc: Loc, field: str, depth: int,
             count: list[int]) -> Node:
    """Turn a composed YAML node into a Node tree; a mapping value is located at its key's line."""
    count[0] += 1
    if depth > _MAX_DEPTH or count[0] > _MAX_VALUES:
        raise located_error(loc, field, "expected a small recipe, got nesting or aliases too deep or too many")
    if not isinstance(yn, yaml.ScalarNode) and yn.tag not in _PLAIN_TAGS:
        # Scalars are built by the safe constructor, which refuses unknown tags; collections are
        # walked here, so a tag such as !!python/object/apply must be refused here.
        raise located_error(loc, field, f"expected valid YAML, got the unsupported tag {yn.tag!r}")
    if isinstance(yn, yaml.MappingNode):
        loader.flatten_mapping(yn)  # resolves `<<: *anchor` merge keys
        out: dict[str, Node] = {}
        for key_node, value_node in yn.value:
            key_loc = Loc(loc.file, key_node.start_mark.line + 1)
            key = loader.construct_object(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str):
                raise located_error(key_loc, field, f"expected a string key, got {describe_value(key)}")
            sub = f"{field}.{key}" if field else key
            if key in out:
                raise located_error(key_loc, sub, f"expected each key once, got a duplicate (first at line "
                                                  f"{out[key].loc.line})")
            out[key] = _to_node(loader, value_node, key_loc, sub, depth + 1, count)
        return Node(out, loc)
    if isinstance(yn, yaml.SequenceNode):
        items = [_to_node(loader, item, Loc(loc.file, item.start_mark.line + 1), f"{field}[{i}]",
                          depth + 1, count) for i, item in enumerate(yn.value)]
        return Node(items, loc)
    value = loader.construct_object(yn)
    # Timestamps, binary and the like have no place in a recipe and no canonical JSON form.
    if value is not None and not isinstance(value, str | int | float | bool):
        raise located_error(loc, field, f"expected a string, number or boolean, got {type(value).__name__} "
                                        f"{yn.value!r} (quote it to make it a string)")
    return Node(value, loc)

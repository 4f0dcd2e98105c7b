"""Load a recipe: safe YAML -> inheritance (`base:`) -> sandboxed templates -> validation -> `Recipe`.

Every value keeps the file and line it came from, so each error is one line of the form
``<file>:<line>: <dotted.field>: expected <what>, got <what>``. Everything a build needs to know
about its inputs (types, ranges, checkpoints on disk) is checked here, before any work starts.
"""

from __future__ import annotations

import copy
import difflib
import importlib.util
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import jinja2
import yaml

from llmbuild import LlmbuildError, MissingCheckpointError
from llmbuild.recipe import schema_table as st
from llmbuild.recipe.sandbox import BoundedSandbox
from llmbuild.recipe.tolerances import default_image_cosine, default_tolerances
from llmbuild.recipe_types import (
    VENDOR_CHIPS,
    BmodelConfig,
    QuantConfig,
    Recipe,
    SourceConfig,
    StagesConfig,
    TargetConfig,
    VerifyConfig,
    VisionConfig,
)

if TYPE_CHECKING:
    from llmbuild.frontend.spec import ModelSpec

RECIPES_ENV = "LLMBUILD_RECIPES"
MODELS_ENV = "LLMBUILD_MODELS"

# A recipe is a few dozen values; these bounds stop alias bombs and recursive anchors early.
_MAX_DEPTH = 32
_MAX_VALUES = 100_000
# Top-level keys acted on while reading the files; they are not part of the merged recipe.
_DIRECTIVES = frozenset({"base"})


# ---------------------------------------------------------------------------------------------
# Located values


@dataclass(frozen=True)
class Loc:
    file: Path
    line: int

    def __str__(self) -> str:
        return f"{_display(self.file)}:{self.line}"


@dataclass
class Node:
    """A YAML value with its origin. Mapping values are dict[str, Node], sequences list[Node]."""

    value: Any
    loc: Loc


def _display(path: Path) -> str:
    # Paths under the working directory are shown relative, as a user would type them.
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _fail(loc: Loc, field: str, message: str) -> LlmbuildError:
    text = f"{loc}: {field}: {message}" if field else f"{loc}: {message}"
    return LlmbuildError(" ".join(text.split("\n")))


def _describe(value: Any) -> str:
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


# ---------------------------------------------------------------------------------------------
# YAML


class _SafeLoader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-6` as a float (YAML 1.1 would make it a string)."""


_SafeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


_PLAIN_TAGS = frozenset({"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"})


def _read_yaml(path: Path) -> Node:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LlmbuildError(f"{_display(path)}: cannot read recipe: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - data.rfind(b"\n", 0, exc.start)
        raise _fail(Loc(path, line), "", f"expected UTF-8 text, got byte {data[exc.start]:#04x} at column "
                                         f"{column}") from None
    loader = None
    try:
        loader = _SafeLoader(text)  # may already refuse the text (non-printable characters)
        root = loader.get_single_node()
        if root is None:
            raise _fail(Loc(path, 1), "", "expected a mapping of recipe fields, got an empty file")
        return _to_node(loader, root, Loc(path, root.start_mark.line + 1), "", 0, [0])
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        what = exc.problem or exc.context or "a YAML error"
        raise _fail(Loc(path, line), "", f"expected valid YAML, got {what}") from None
    except yaml.YAMLError as exc:
        raise _fail(Loc(path, 1), "", f"expected valid YAML, got {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _to_node(loader: yaml.SafeLoader, yn: yaml.Node, loc: Loc, field: str, depth: int,
             count: list[int]) -> Node:
    """Turn a composed YAML node into a Node tree; a mapping value is located at its key's line."""
    count[0] += 1
    if depth > _MAX_DEPTH or count[0] > _MAX_VALUES:
        raise _fail(loc, field, "expected a small recipe, got nesting or aliases too deep or too many")
    if not isinstance(yn, yaml.ScalarNode) and yn.tag not in _PLAIN_TAGS:
        # Scalars are built by the safe constructor, which refuses unknown tags; collections are
        # walked here, so a tag such as !!python/object/apply must be refused here.
        raise _fail(loc, field, f"expected valid YAML, got the unsupported tag {yn.tag!r}")
    if isinstance(yn, yaml.MappingNode):
        loader.flatten_mapping(yn)  # resolves `<<: *anchor` merge keys
        out: dict[str, Node] = {}
        for key_node, value_node in yn.value:
            key_loc = Loc(loc.file, key_node.start_mark.line + 1)
            key = loader.construct_object(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str):
                raise _fail(key_loc, field, f"expected a string key, got {_describe(key)}")
            sub = f"{field}.{key}" if field else key
            if key in out:
                raise _fail(key_loc, sub, f"expected each key once, got a duplicate (first at line "
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
        raise _fail(loc, field, f"expected a string, number or boolean, got {type(value).__name__} "
                                f"{yn.value!r} (quote it to make it a string)")
    return Node(value, loc)


# ---------------------------------------------------------------------------------------------
# Inheritance


def _load_tree(path: Path, chain: tuple[Path, ...] = ()) -> Node:
    """Read `path` and everything it inherits, merged; `chain` holds the files that inherit it."""
    node = _read_yaml(path)
    if not isinstance(node.value, dict):
        raise _fail(node.loc, "", f"expected a mapping of recipe fields, got {_describe(_plain(node))}")
    quant = node.value.get("quantization")
    if quant is not None and quant.value == "auto":  # `quantization: auto` is `quantization: {mode: auto}`
        node.value["quantization"] = Node({"mode": Node("auto", quant.loc)}, quant.loc)
    base = node.value.pop("base", None)
    if base is None or base.value is None:
        return node
    name = base.value
    if not isinstance(name, str) or not name or "/" in name or "\\" in name:
        raise _fail(base.loc, "base", f"expected the name of a recipe in {_display(path.parent)}, "
                                      f"got {_describe(name)}")
    name = name.removesuffix(".yaml")
    base_path = path.parent / f"{name}.yaml"
    here = (*chain, path.resolve())
    if base_path.resolve() in here:
        cycle = " -> ".join([p.stem for p in here] + [name])
        raise _fail(base.loc, "base", f"expected a recipe that does not inherit from itself, got the "
                                      f"cycle {cycle}")
    if not base_path.is_file():
        raise _fail(base.loc, "base", f"expected a recipe in {_display(path.parent)}, got {name!r} "
                                      f"(no file {_display(base_path)})")
    return _merge(_load_tree(base_path, here), node)


def _merge(base: Node, child: Node) -> Node:
    """Deep merge: mappings merge key by key, anything else (lists, scalars, null) replaces."""
    if not (isinstance(base.value, dict) and isinstance(child.value, dict)):
        return child
    merged = dict(base.value)
    for key, value in child.value.items():
        merged[key] = _merge(merged[key], value) if key in merged else value
    return Node(merged, child.loc)


# ---------------------------------------------------------------------------------------------
# Templates


class _Environ(Mapping[str, str]):
    """A read-only snapshot of os.environ for templates."""

    def __init__(self) -> None:
        self._vars = dict(os.environ)

    def __getitem__(self, key: str) -> str:
        return self._vars[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._vars)

    def __len__(self) -> int:
        return len(self._vars)


class _Undefined(jinja2.StrictUndefined):
    """StrictUndefined whose message is the 'expected ..., got ...' part of our error line."""

    __slots__ = ()

    @property
    def _undefined_message(self) -> str:
        if self._undefined_hint:  # the sandbox refusing an attribute: its own words say it best
            return self._undefined_hint
        if isinstance(self._undefined_obj, _Environ):
            name = self._undefined_name
            hint = (f" (set {MODELS_ENV} to the folder holding your checkpoints, or give a default: "
                    f"{{{{ env.{MODELS_ENV} | default('/models') }}}})" if name == MODELS_ENV
                    else f" (set it, or give a default: {{{{ env.{name} | default('...') }}}})")
            return f"expected environment variable {name} to be set, got it unset{hint}"
        return f"expected a template using only env and recipe, got {super()._undefined_message}"


_TEMPLATE_MARKERS = ("{{", "{%", "{#")


def _render_tree(node: Node, field: str, sandbox: BoundedSandbox, context: dict[str, Any]) -> None:
    """Render every string value in place; templates see only `env` and `recipe`."""
    if isinstance(node.value, dict):
        for key, child in node.value.items():
            _render_tree(child, f"{field}.{key}" if field else key, sandbox, context)
    elif isinstance(node.value, list):
        for i, child in enumerate(node.value):
            _render_tree(child, f"{field}[{i}]", sandbox, context)
    elif isinstance(node.value, str) and any(m in node.value for m in _TEMPLATE_MARKERS):
        node.value = _render(node, field, sandbox, context)


def _render(node: Node, field: str, sandbox: BoundedSandbox, context: dict[str, Any]) -> str:
    try:
        return sandbox.render_bounded(node.value, context)
    except jinja2.UndefinedError as exc:
        raise _fail(node.loc, field, str(exc)) from None
    except jinja2.sandbox.SecurityError as exc:
        raise _fail(node.loc, field, f"expected a template the sandbox allows, got {exc}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise _fail(node.loc, field, f"expected a valid Jinja2 template, got {exc.message}") from None
    except Exception as exc:  # noqa: BLE001 - any failure inside a user template is a user error
        raise _fail(node.loc, field, f"expected a template that renders, got "
                                     f"{type(exc).__name__}: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Validation against the schema table


@dataclass
class _Checked:
    raw: dict[str, Any]
    given: dict[str, Node]  # dotted path -> node, for every schema field set in the files
    sections: dict[str, Node]  # dotted path -> node of each section mapping (given or not)


def _plain(node: Node) -> Any:
    if isinstance(node.value, dict):
        return {k: _plain(v) for k, v in node.value.items()}
    if isinstance(node.value, list):
        return [_plain(v) for v in node.value]
    return node.value


def _check_section(section: str, node: Node, out: _Checked) -> dict[str, Any]:
    specs = {f.key: f for f in st.children(section)}
    out.sections[section] = node
    for key, child in node.value.items():
        if key not in specs:
            field = f"{section}.{key}" if section else key
            close = difflib.get_close_matches(key, list(specs), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _fail(child.loc, field, f"expected one of the keys {', '.join(specs)}, got unknown "
                                          f"key {key!r}{hint}")
    result: dict[str, Any] = {}
    for key, spec in specs.items():
        if spec.path in _DIRECTIVES:
            continue
        child = node.value.get(key)
        if child is None or child.value is None:  # null means unset: the default applies
            result[key] = _missing(spec, node, out)
        else:
            out.given[spec.path] = child
            result[key] = _check_field(spec, child, out)
    return result


def _missing(spec: st.FieldSpec, parent: Node, out: _Checked) -> Any:
    if spec.required:
        raise _fail(parent.loc, spec.path, f"expected {spec.expected()}, got nothing (a required field)")
    if spec.type == "section":
        return _check_section(spec.path, Node({}, parent.loc), out)
    return copy.deepcopy(spec.default) if spec.has_default else None


def _check_field(spec: st.FieldSpec, node: Node, out: _Checked) -> Any:
    if spec.type == "section":
        if not isinstance(node.value, dict):
            raise _fail(node.loc, spec.path, f"expected a mapping, got {_describe(node.value)}")
        return _check_section(spec.path, node, out)
    value = _plain(node)
    if not st.type_ok(spec.type, value):
        if spec.type == "list[int]" and isinstance(node.value, list):
            # Point at the offending item, not the list.
            bad = next(i for i, v in enumerate(node.value) if not st.type_ok("integer", v.value))
            raise _fail(node.value[bad].loc, f"{spec.path}[{bad}]",
                        f"expected an integer, got {_describe(node.value[bad].value)}")
        raise _fail(node.loc, spec.path, f"expected {st.TYPE_WORDS[spec.type]}, got {_describe(value)}")
    if spec.type == "number":
        value = float(value)
    if spec.constraint is not None and not spec.constraint.ok(value):
        shown = node.value if spec.type != "list[int]" else value
        raise _fail(node.loc, spec.path, f"expected {spec.expected()}, got {_describe(shown)}")
    return value


# ---------------------------------------------------------------------------------------------
# Rules across fields


def _check_stages(out: _Checked, top: Path) -> None:
    seq, prefill = out.given["stages.seq_length"], out.given["stages.prefill_length"]
    if prefill.value <= seq.value:
        return
    # Blame the value set in the recipe itself rather than the one it inherited: that is the edit.
    if seq.loc.file == top and prefill.loc.file != top:
        raise _fail(seq.loc, "stages.seq_length", f"expected an integer >= stages.prefill_length "
                                                  f"({prefill.value}, from {prefill.loc}), got {seq.value}")
    raise _fail(prefill.loc, "stages.prefill_length", f"expected an integer <= stages.seq_length "
                                                      f"({seq.value}, from {seq.loc}), got {prefill.value}")


def _check_rules(out: _Checked, top: Path) -> None:
    raw, given = out.raw, out.given
    _check_stages(out, top)
    _check_source_fields(out)
    chip = raw["target"]["chip"]
    if raw["bmodel"]["build"] and chip not in VENDOR_CHIPS:
        raise _fail(given["bmodel.build"].loc, "bmodel.build", f"expected false for target.chip {chip} "
                    f"(TPU-MLIR compiles for {', '.join(VENDOR_CHIPS)}), got true")
    if raw["bmodel"]["build"] and raw["vision"]["family"] == "minicpmv":
        raise _fail(given["bmodel.build"].loc, "bmodel.build", "expected false for a MiniCPM-V recipe (its "
                    "slice-wise vit net has no export to the vendor's dialect yet), got true")
    if raw["bmodel"]["history"] and raw["quantization"]["mode"] == "f32":
        raise _fail(given["bmodel.history"].loc, "bmodel.history", "expected false with quantization.mode f32 "
                    "(the history form's prefill needs the vendor's fused attention, which has no f32 form), got true")
    if raw["bmodel"]["cores"] == 2 and chip != "bm1688":
        raise _fail(given["bmodel.cores"].loc, "bmodel.cores", f"expected 1 for target.chip {chip} (two "
                    "cores are the BM1688's), got 2")
    verify = raw["verify"]
    if verify["prompt"] is not None and verify["prompt_ids"] is not None:
        raise _fail(given["verify.prompt"].loc, "verify.prompt",
                    "expected either prompt or prompt_ids, got both")
    vocab = (raw["source"]["config"] or {}).get("vocab_size")
    if verify["prompt_ids"] and isinstance(vocab, int) and max(verify["prompt_ids"]) >= vocab:
        raise _fail(given["verify.prompt_ids"].loc, "verify.prompt_ids",
                    f"expected ids < source.config.vocab_size ({vocab}), got {max(verify['prompt_ids'])}")


def _check_source_fields(out: _Checked) -> None:
    kind = out.raw["source"]["kind"]
    for spec in st.children("source"):
        if spec.kinds is not None and kind not in spec.kinds and spec.path in out.given:
            raise _fail(out.given[spec.path].loc, spec.path,
                        f"expected no {spec.key} for source.kind {kind} (it is for "
                        f"{', '.join(spec.kinds)}), got {_describe(_plain(out.given[spec.path]))}")
        if kind in spec.required_for and spec.path not in out.given:
            raise _fail(out.sections["source"].loc, spec.path,
                        f"expected {spec.expected()} (required for source.kind {kind}), got nothing")
    if kind == "synthetic":
        config = out.given["source.config"]
        model_type = config.value.get("model_type")
        if model_type is None or not isinstance(model_type.value, str):
            where = model_type.loc if model_type is not None else config.loc
            got = _describe(model_type.value) if model_type is not None else "nothing"
            raise _fail(where, "source.config.model_type", f"expected a string, got {got}")
    vision_config = out.given.get("vision.config")
    if vision_config is not None and "vision.family" not in out.given:
        raise _fail(vision_config.loc, "vision.config", "expected vision.family with it (the tower's "
                                                        "definition), got no vision.family")
    if vision_config is not None and kind != "synthetic":
        raise _fail(vision_config.loc, "vision.config", f"expected no vision.config for source.kind {kind} "
                                                        "(the checkpoint's config.json has it)")
    if kind == "gguf":
        has_path, has_pkg, has_file = (f"source.{k}" in out.given for k in ("path", "package", "file"))
        if has_path and (has_pkg or has_file):
            key = "package" if has_pkg else "file"
            raise _fail(out.given[f"source.{key}"].loc, f"source.{key}",
                        "expected either source.path or source.package + source.file, got both")
        if not has_path and not (has_pkg and has_file):
            missing = "file" if has_pkg else "package" if has_file else "path"
            what = "a string" if missing != "path" else "a .gguf path, or source.package + source.file"
            raise _fail(out.sections["source"].loc, f"source.{missing}",
                        f"expected {what} (required for source.kind gguf), got nothing")


def _resolve_path(node: Node) -> Path:
    # Relative to the recipe file that set it, so a recipe means the same from any directory.
    path = Path(node.value).expanduser()
    return path if path.is_absolute() else (node.loc.file.parent / path).resolve()


def _config_file(out: _Checked) -> Path | None:
    """The shipped config.json of an hf recipe (`source.config_file`), checked to exist."""
    node = out.given.get("source.config_file")
    if node is None:
        return None
    path = _resolve_path(node)
    if not path.is_file():
        raise _fail(node.loc, "source.config_file", f"expected a config.json file, got {path} (not found)")
    return path


def _locate_checkpoint(out: _Checked, require_checkpoint: bool = True) -> Path | None:
    """Check the checkpoint is on disk (without reading it); return the file or directory.

    With `require_checkpoint=False` an hf recipe that ships `source.config_file` may lack its checkpoint:
    the (absent) directory is returned and readers of the config fall back to the shipped file.
    """
    source, given = out.raw["source"], out.given
    hint = f"or set {MODELS_ENV} to the folder holding it"
    if source["kind"] == "hf":
        node = given["source.path"]
        path = _resolve_path(node)
        config_file = _config_file(out)
        if config_file is not None and not require_checkpoint:
            return path
        if not path.exists():
            also = "; `llmbuild estimate` needs only source.config_file" if config_file is not None else ""
            raise _missing_checkpoint(node, f"checkpoint directory {path} not found (put the Hugging Face "
                                            f"checkpoint there, {hint}){also}")
        if not (path / "config.json").is_file():
            raise _fail(node.loc, "source.path", f"expected a Hugging Face checkpoint directory holding "
                                                 f"config.json, got {path} without it")
        return path
    if source["kind"] == "gguf":
        if "source.path" in given:
            node = given["source.path"]
            path = _resolve_path(node)
            if not path.exists():
                raise _missing_checkpoint(node, f"GGUF file {path} not found (put the file there, {hint})")
            if not path.is_file():
                raise _fail(node.loc, "source.path", f"expected a .gguf file, got directory {path}")
            return path
        return _package_file(given["source.package"], given["source.file"])
    return None


def _missing_checkpoint(node: Node, message: str) -> MissingCheckpointError:
    return MissingCheckpointError(str(_fail(node.loc, "source.path", message)))


def package_dirs(package: str) -> list[Path]:
    """Directories of an installed package, found without importing it (nor its parents)."""
    parts = package.split(".")
    if not all(p.isidentifier() for p in parts):
        return []
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level name: finding it imports nothing
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    dirs = [Path(d) for d in spec.submodule_search_locations]
    for part in parts[1:]:
        dirs = [d / part for d in dirs if (d / part).is_dir()]
    return dirs


def _package_file(pkg_node: Node, file_node: Node) -> Path:
    dirs = package_dirs(pkg_node.value)
    if not dirs:
        raise _fail(pkg_node.loc, "source.package",
                    f"expected an installed Python package, got {pkg_node.value!r} (not found; install "
                    f"the package that ships {file_node.value})")
    rel = Path(file_node.value)
    if rel.is_absolute() or ".." in rel.parts:
        raise _fail(file_node.loc, "source.file",
                    f"expected a file name inside package {pkg_node.value}, got {file_node.value!r}")
    for d in dirs:
        if (d / rel).is_file():
            return d / rel
    raise _fail(file_node.loc, "source.file", f"expected a file inside package {pkg_node.value} "
                                              f"({dirs[0]}), got {file_node.value!r} (not found there)")


# ---------------------------------------------------------------------------------------------
# Public API


def default_recipes_dir() -> Path:
    return Path(os.environ.get(RECIPES_ENV) or "recipes")


def list_recipes(recipes_dir: Path | None = None, buildable_only: bool = False) -> list[str]:
    """Sorted names of the recipes in `recipes_dir`; files starting with `_` are bases, not recipes.

    `buildable_only` leaves out recipes that say `build: false` (estimate-only): what `snakemake all`
    builds. It reads each file and its bases, but neither renders templates nor looks for checkpoints.
    """
    directory = Path(recipes_dir) if recipes_dir is not None else default_recipes_dir()
    names = sorted(p.stem for p in directory.glob("*.yaml") if not p.name.startswith("_"))
    if buildable_only:
        names = [n for n in names if _buildable(directory / f"{n}.yaml")]
    return names


def _buildable(path: Path) -> bool:
    """The `build` flag; True for a recipe that cannot be read (loading it names the problem, and only its
    own target fails: the workflow lists it apart, build/dag.py: recipe_problems)."""
    try:
        return _build_flag(path)
    except LlmbuildError:
        return True


def _build_flag(path: Path) -> bool:
    node = _load_tree(path).value.get("build")
    if node is None or node.value is None:
        return True
    if not isinstance(node.value, bool):
        raise _fail(node.loc, "build", f"expected a boolean, got {_describe(node.value)}")
    return node.value


def _find(name_or_path: str | Path, recipes_dir: Path | None) -> Path:
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or "/" in text or os.sep in text or text.endswith((".yaml", ".yml")):
        path = Path(name_or_path)
        if not path.is_file():
            raise LlmbuildError(f"{_display(path)}: recipe file not found")
        return path
    directory = Path(recipes_dir) if recipes_dir is not None else default_recipes_dir()
    path = directory / f"{text}.yaml"
    if not path.is_file():
        known = ", ".join(list_recipes(directory)) if directory.is_dir() else "none"
        raise LlmbuildError(f"unknown recipe {text!r}: expected one of {known} (in {_display(directory)}, "
                            f"or set {RECIPES_ENV})")
    return path


def load_recipe(name_or_path: str | Path, recipes_dir: Path | None = None, require_checkpoint: bool = True,
                check_fit: bool = True) -> Recipe:
    """Load, merge, render and fully validate a recipe; raise LlmbuildError (one line) on any fault.

    `require_checkpoint=False` is for tools that need only the model's shape (`llmbuild estimate`): an
    hf recipe with an existing `source.config_file` then loads without its checkpoint directory.
    `check_fit=False` loads a model the chip cannot hold (`llmbuild estimate` reports how far it is off);
    a build always checks.
    """
    path = _find(name_or_path, recipes_dir)
    name = path.stem
    tree = _load_tree(path)
    _render_tree(tree, "", BoundedSandbox(undefined=_Undefined, keep_trailing_newline=True),
                 {"env": _Environ(), "recipe": name})
    out = _Checked(raw={}, given={}, sections={})
    out.raw = _check_section("", tree, out)
    _check_rules(out, path)
    checkpoint = _locate_checkpoint(out, require_checkpoint)
    config_file = _config_file(out)
    quant = _resolve_quantization(out, checkpoint, config_file)
    recipe = _build(name, path, out.raw, checkpoint, config_file, quant)
    _check_model(recipe, out, check_fit)
    return recipe


MAX_VOCAB = 1 << 21  # far above any released vocabulary (Gemma's 262k); beyond it a build runs out of memory


def _check_architecture(recipe: Recipe, found: str, where: str, out: _Checked) -> None:
    """The model is imported as its checkpoint says; `architecture` states it, and must agree (a recipe
    that said llama over a Qwen2 checkpoint would otherwise build the Qwen2 model and claim a Llama)."""
    if recipe.architecture != found:
        raise _fail(out.given["architecture"].loc, "architecture",
                    f"expected {found} (what {where} names), got {recipe.architecture}")


def _check_model(recipe: Recipe, out: _Checked, check_fit: bool = True) -> None:
    """What the model's shape must satisfy for this recipe, checked at load rather than at `plan` or in a
    layer job: the config itself (a synthetic source's fields are the recipe's, so they get its lines),
    head ratios, the vocabulary, and quantization groups against every projection's input size. GGUF
    files are checked when prepare reads them."""
    from llmbuild.frontend.config_spec import architecture_without_weights, spec_without_weights
    from llmbuild.quant.scheme import recipe_scheme

    source = recipe.source
    if source.kind != "hf" or _config_json(source.path, source.config_file) is not None:
        where = {"synthetic": "source.config's model_type", "hf": "config.json's model_type",
                 "gguf": "the GGUF file's general.architecture"}[source.kind]
        try:
            found = architecture_without_weights(source)
        except LlmbuildError:
            found = None  # an unknown model type: the model's own check below (or prepare) names it
        if found is not None:
            _check_architecture(recipe, found, where, out)
    if source.kind == "gguf" or (source.kind == "hf" and _config_json(source.path, source.config_file) is None):
        return
    config_node = out.given.get("source.config") or out.sections["source"]
    try:
        spec = spec_without_weights(source)
    except LlmbuildError as exc:
        if "missing field" in str(exc):
            return  # an incomplete config: prepare names the field when it builds the model's shape
        if source.kind != "synthetic":
            raise  # names the checkpoint's config.json and the field
        _model_error(recipe, config_node, str(exc), getattr(exc, "field", None))
    origin = "source.config" if source.kind == "synthetic" else "config.json"
    seq = recipe.stages.seq_length
    if seq > spec.max_position_embeddings:
        raise _fail(out.given["stages.seq_length"].loc, "stages.seq_length",
                    f"expected at most {origin}.max_position_embeddings ({spec.max_position_embeddings}, the "
                    f"positions the model was made for), got {seq}")
    if spec.num_heads % spec.num_kv_heads:
        _model_error(recipe, config_node, f"{origin}: num_attention_heads {spec.num_heads} is not a multiple of "
                     f"num_key_value_heads {spec.num_kv_heads}")
    if spec.vocab_size > MAX_VOCAB:
        _model_error(recipe, config_node, f"{origin}: vocab_size {spec.vocab_size}: expected at most {MAX_VOCAB}")
    if check_fit:
        _check_fit(recipe, spec, out)
    scheme = recipe_scheme(recipe.quantization)
    if scheme is None:
        return
    inputs = {"hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
              "num_attention_heads x head_dim": spec.num_heads * spec.head_dim}
    for what, k in inputs.items():
        try:
            scheme.group_for(k)
        except LlmbuildError:
            node = out.given.get("quantization.group_size") or out.given.get("quantization.mode") \
                or out.sections["quantization"]
            raise _fail(node.loc, "quantization.group_size", f"expected a group size dividing every projection's "
                        f"inputs, got {scheme.group_size}, which does not divide {what} {k}") from None


def _check_fit(recipe: Recipe, spec: ModelSpec, out: _Checked) -> None:
    """The chip's device memory holds the weights, the KV cache and the buffers (the cost model's layout,
    milliseconds for any size): refused here, at the line to change, not at `plan` after `prepare`."""
    from llmbuild.cost.for_recipe import FIT_ADVICE, limit_source, recipe_memory

    memory = recipe_memory(recipe, spec)
    if memory.fits:
        return
    regions = memory.regions
    if "target.device_memory_bytes" in out.given:
        field = "target.device_memory_bytes"
    elif regions.get("kv", 0) + regions.get("activation", 0) > regions.get("weight", 0):
        field = "stages.seq_length"  # the cache and the activations grow with it; the weights do not
    else:
        field = "quantization.mode" if "quantization.mode" in out.given else "target.chip"
    node = out.given.get(field) or out.sections["target"]
    raise _fail(node.loc, field, f"expected room for the model in {recipe.target.chip}'s "
                f"{memory.limit_bytes / 2**30:.2f} GiB of device memory ({limit_source(recipe)}), got a model that "
                f"needs {memory.breakdown()}: {FIT_ADVICE}")


def _config_json(checkpoint: str | Path | None, config_file: str | Path | None) -> Path | None:
    """The config.json a model's shape comes from: the checkpoint's own, else the recipe's shipped copy."""
    if checkpoint and (Path(checkpoint) / "config.json").is_file():
        return Path(checkpoint) / "config.json"
    return Path(config_file) if config_file else None


def _model_error(recipe: Recipe, config_node: Node, message: str, field: str | None = None) -> NoReturn:
    """A fault of the model's configuration: at the recipe's line for a synthetic source (the line of
    `field`, else of the config field the message names, the last one named when several are), else the
    checkpoint's file."""
    message = message.removeprefix("source.config: ")
    if recipe.source.kind == "synthetic":
        fields = config_node.value if isinstance(config_node.value, dict) else {}
        key = field.split("[")[0] if field else None
        if key in fields:
            message = message.removeprefix(f"{field}: ")
            raise _fail(_item_loc(fields[key], field), f"source.config.{field}", message)
        # A field the recipe does not spell out (a derived head_dim): the line of the fields it comes from.
        named = [(message.rfind(key), key) for key in fields if re.search(rf"\b{re.escape(key)}\b", message)]
        if named:
            key = max(named)[1]
            raise _fail(fields[key].loc, f"source.config.{key}", message)
        raise _fail(config_node.loc, "source.config", message)
    where = _config_json(recipe.source.path, recipe.source.config_file) or "config.json"
    raise LlmbuildError(f"{where}: {message.removeprefix('config.json: ')}")


def _item_loc(node: Node, field: str) -> Loc:
    """The line of `layer_types[3]` inside a list node (a flow list `[a, b]` has one line for all)."""
    index = re.fullmatch(r"[^\[]+\[(\d+)\]", field)
    if index and isinstance(node.value, list) and int(index.group(1)) < len(node.value):
        return node.value[int(index.group(1))].loc
    return node.loc


def _resolve_quantization(out: _Checked, checkpoint: Path | None, config_file: Path | None) -> dict[str, Any]:
    from llmbuild.recipe.quantization import resolve

    q = dict(out.raw["quantization"])
    if "quantization.calibration" in out.given:
        q["calibration"] = str(_resolve_path(out.given["quantization.calibration"]))
    config_path = _config_json(checkpoint, config_file)

    def fail(field: str, message: str) -> LlmbuildError:
        node = out.given.get(field) or out.given.get("quantization.mode") or out.sections["quantization"]
        return _fail(node.loc, field, message)

    data_dir = Path(__file__).resolve().parent.parent / "data"
    return resolve(q, set(out.given), out.raw["source"]["kind"], config_path, data_dir, fail)


def _build(name: str, path: Path, raw: dict[str, Any], checkpoint: Path | None,
           config_file: Path | None, quant: dict[str, Any]) -> Recipe:
    src, verify = raw["source"], raw["verify"]
    prompt_ids = tuple(verify["prompt_ids"]) if verify["prompt_ids"] is not None else None
    source = SourceConfig(
        kind=src["kind"],
        # Resolved and absolute; for a packaged GGUF, the located file.
        path=str(checkpoint) if checkpoint is not None else None,
        package=src["package"],
        file=src["file"],
        config=copy.deepcopy(src["config"]),
        seed=src["seed"],
        config_file=str(config_file) if config_file is not None else None,
    )
    layers, params = _model_size(source)
    return Recipe(
        name=name,
        path=path.resolve(),
        description=raw["description"],
        source=source,
        architecture=raw["architecture"],
        quantization=QuantConfig(**quant),
        target=TargetConfig(**raw["target"]),
        stages=StagesConfig(**raw["stages"]),
        verify=VerifyConfig(**{**verify, **_absent_tolerances(verify, quant["mode"], layers, params),
                               "prompt_ids": prompt_ids}),
        build=raw["build"],
        bmodel=BmodelConfig(**raw["bmodel"]),
        vision=_vision(raw["vision"], quant["mode"]),
        raw=raw,
    )


def _model_size(source: SourceConfig) -> tuple[int | None, float | None]:
    """(layers, parameters) of the model, which the default tolerances depend on (recipe/tolerances.py); None
    where the configuration does not say (the model's own check, or prepare, names what is missing)."""
    from llmbuild.frontend.config_spec import spec_without_weights

    try:
        spec = spec_without_weights(source)
    except (LlmbuildError, KeyError, TypeError, ValueError):
        return None, None
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    layer = spec.hidden_size * (2 * q + 2 * kv) + 3 * spec.hidden_size * spec.intermediate_size
    return spec.num_layers, float(spec.num_layers * layer + spec.vocab_size * spec.hidden_size)


def _vision(vision: dict[str, Any], mode: str) -> VisionConfig | None:
    if vision["family"] is None:
        return None
    cosine = vision["image_cosine"] if vision["image_cosine"] is not None else default_image_cosine(mode)
    return VisionConfig(vision["family"], vision["exporter"], copy.deepcopy(vision["config"]), cosine,
                        vision["max_tiles"])


def _absent_tolerances(verify: dict[str, Any], mode: str, layers: int | None,
                       params: float | None) -> dict[str, float]:
    defaults = default_tolerances(mode, layers, params)
    return {kind: value for kind, value in defaults.items() if verify.get(kind) is None}

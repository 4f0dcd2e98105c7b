"""Where a recipe's weights are: its checkpoint directory or GGUF file (relative to the recipe, `~`
expanded, or under LLMBUILD_MODELS), a GGUF shipped in an installed package (found without
importing it), or a config.json shipped with the recipe.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from llmbuild import MissingCheckpointError
from llmbuild.recipe.nodes import Node, located_error
from llmbuild.recipe.validation import Checked

MODELS_ENV = "LLMBUILD_MODELS"


def resolve_path(node: Node) -> Path:
    # Relative to the recipe file that set it, so a recipe means the same from any directory.
    path = Path(node.value).expanduser()
    return path if path.is_absolute() else (node.loc.file.parent / path).resolve()


def shipped_config(out: Checked) -> Path | None:
    """The shipped config.json of an hf recipe (`source.config_file`), checked to exist."""
    node = out.given.get("source.config_file")
    if node is None:
        return None
    path = resolve_path(node)
    if not path.is_file():
        raise located_error(node.loc, "source.config_file", f"expected a config.json file, got {path} (not found)")
    return path


def locate_checkpoint(out: Checked, require_checkpoint: bool = True) -> Path | None:
    """Check the checkpoint is on disk (without reading it); return the file or directory.

    With `require_checkpoint=False` an hf recipe that ships `source.config_file` may lack its checkpoint:
    the (absent) directory is returned and readers of the config fall back to the shipped file.
    """
    source, given = out.raw["source"], out.given
    hint = f"or set {MODELS_ENV} to the folder holding it"
    if source["kind"] == "hf":
        node = given["source.path"]
        path = resolve_path(node)
        config_file = shipped_config(out)
        if config_file is not None and not require_checkpoint:
            return path
        if not path.exists():
            also = "; `llmbuild estimate` needs only source.config_file" if config_file is not None else ""
            raise _missing_checkpoint(node, f"checkpoint directory {path} not found (put the Hugging Face "
                                            f"checkpoint there, {hint}){also}")
        if not (path / "config.json").is_file():
            raise located_error(node.loc, "source.path", f"expected a Hugging Face checkpoint directory holding "
                                                         f"config.json, got {path} without it")
        return path
    if source["kind"] == "gguf":
        if "source.path" in given:
            node = given["source.path"]
            path = resolve_path(node)
            if not path.exists():
                raise _missing_checkpoint(node, f"GGUF file {path} not found (put the file there, {hint})")
            if not path.is_file():
                raise located_error(node.loc, "source.path", f"expected a .gguf file, got directory {path}")
            return path
        return _package_file(given["source.package"], given["source.file"])
    return None


def _missing_checkpoint(node: Node, message: str) -> MissingCheckpointError:
    return MissingCheckpointError(str(located_error(node.loc, "source.path", message)))


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
        raise located_error(pkg_node.loc, "source.package",
                            f"expected an installed Python package, got {pkg_node.value!r} (not found; install "
                            f"the package that ships {file_node.value})")
    rel = Path(file_node.value)
    if rel.is_absolute() or ".." in rel.parts:
        raise located_error(file_node.loc, "source.file",
                            f"expected a file name inside package {pkg_node.value}, got {file_node.value!r}")
    for d in dirs:
        if (d / rel).is_file():
            return d / rel
    raise located_error(file_node.loc, "source.file", f"expected a file inside package {pkg_node.value} "
                                                      f"({dirs[0]}), got {file_node.value!r} (not found there)")


def config_json_path(checkpoint: str | Path | None, config_file: str | Path | None) -> Path | None:
    """The config.json a model's shape comes from: the checkpoint's own, else the recipe's shipped copy."""
    if checkpoint and (Path(checkpoint) / "config.json").is_file():
        return Path(checkpoint) / "config.json"
    return Path(config_file) if config_file else None

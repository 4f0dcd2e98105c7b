"""Finding recipes: by name in the recipes directory (LLMBUILD_RECIPES, else the shipped one) or by path,
and which of them build (`build: false` is for `llmbuild estimate` only).
"""

from __future__ import annotations

import os
from pathlib import Path

from llmbuild import LlmbuildError
from llmbuild.recipe.inheritance import load_tree
from llmbuild.recipe.nodes import describe_value, display_path, located_error

RECIPES_ENV = "LLMBUILD_RECIPES"


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
    node = load_tree(path).value.get("build")
    if node is None or node.value is None:
        return True
    if not isinstance(node.value, bool):
        raise located_error(node.loc, "build", f"expected a boolean, got {describe_value(node.value)}")
    return node.value


def find_recipe(name_or_path: str | Path, recipes_dir: Path | None) -> Path:
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or "/" in text or os.sep in text or text.endswith((".yaml", ".yml")):
        path = Path(name_or_path)
        if not path.is_file():
            raise LlmbuildError(f"{display_path(path)}: recipe file not found")
        return path
    directory = Path(recipes_dir) if recipes_dir is not None else default_recipes_dir()
    path = directory / f"{text}.yaml"
    if not path.is_file():
        known = ", ".join(list_recipes(directory)) if directory.is_dir() else "none"
        raise LlmbuildError(f"unknown recipe {text!r}: expected one of {known} (in {display_path(directory)}, "
                            f"or set {RECIPES_ENV})")
    return path

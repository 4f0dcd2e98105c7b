"""How far each model family reaches into the package: the modules, and the packages they sit in, whose code
names the family (a string literal, an identifier or an imported module's name holding the family's name,
case-insensitive; comments and docstrings do not count) or whose own path does.

    python benchmarks/family_footprint.py [--root CHECKOUT] [--comments] [--list]

`--comments` counts any mention, comments and docstrings included (a plain grep's count).

A family that is one folder names itself in that folder and in the registry's line, and nowhere else; each
further package is a place a new family would also have to be added. The last two columns count the modules
and packages outside its folder (`llmbuild/families/<family>/`) and the registry. A module directly under `llmbuild/`
counts as a package of its own (as in pyproject.toml's layers).
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_5", "internvl", "minicpmv", "minicpmv4_6")


def names(family: str, text: str) -> bool:
    """Whether `text` names `family`: a version suffix after it names another family (`qwen3_5` is not
    `qwen3`), a recipe's other suffixes do not (`qwen3_tiny_f32` names `qwen3`)."""
    return re.search(rf"{re.escape(family)}(?![0-9]|_[0-9])", text) is not None


def _docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (of the module, a class or a function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def code_words(source: str) -> str:
    """The module's code less comments and docstrings, lower-cased: names, literals and imported modules."""
    tree = ast.parse(source)
    docs = _docstring_nodes(tree)
    words: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            words.append(node.value)
        elif isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words.append(node.name)
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            words.append(node.arg)
        elif isinstance(node, ast.Import):
            words += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            words += [node.module or ""] + [alias.name for alias in node.names]
    return "\n".join(words).lower()


def package_of(module: Path, package_root: Path) -> str:
    parts = module.relative_to(package_root).parts
    return parts[0] if len(parts) > 1 else module.stem


def footprint(root: Path, comments: bool) -> dict[str, list[Path]]:
    """Family -> the modules of `root`/llmbuild that name it (`comments`: in any text, comments included)."""
    package_root = root / "llmbuild"
    modules = sorted(package_root.rglob("*.py"))
    texts = {m: (str(m.relative_to(package_root)).lower(),
                 m.read_text().lower() if comments else code_words(m.read_text())) for m in modules}
    return {family: [m for m, (path, words) in texts.items() if names(family, path) or names(family, words)]
            for family in FAMILIES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the checkout to measure (default: this one)")
    parser.add_argument("--comments", action="store_true", help="count mentions in comments and docstrings too")
    parser.add_argument("--list", action="store_true", help="also list each family's modules")
    args = parser.parse_args()
    found = footprint(args.root, args.comments)
    package_root = args.root / "llmbuild"
    print(f"{'family':<10} {'modules':>7} {'packages':>8} {'outside':>7} {'packages':>8}  packages outside")
    for family, modules in found.items():
        packages = sorted({package_of(m, package_root) for m in modules})
        home = package_root / "families"
        outside = [m for m in modules if not m.is_relative_to(home / family) and m != home / "registry.py"]
        elsewhere = sorted({package_of(m, package_root) for m in outside})
        print(f"{family:<10} {len(modules):>7} {len(packages):>8} {len(outside):>7} {len(elsewhere):>8}  "
              f"{', '.join(elsewhere)}")
        if args.list:
            for m in modules:
                print(f"{'':<10} {m.relative_to(args.root)}")


if __name__ == "__main__":
    main()

"""The docs, benchmarks, rules, recipes, scripts, the workflow's configuration and llmbuild's comments name no
path of the machine they were written on and nothing outside the repository, so that a user on another machine
can follow every one of them.

Machine paths are the places this project's machines keep models, checkouts and scratch files (/work/, /tmp/,
/root/, /home/, /usr/local/, /mnt/, /opt/, /data/). Paths every Linux system has and that name a system
tool or interface (/usr/bin/time, /dev/null, /proc/..., /etc/slurm/...), and the example deployment of the
README's nightly job (/srv/, /var/log/), are the same on every machine and stay allowed. A relative path
(`../x`) is allowed while it resolves inside the repository from the file that names it.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MACHINE_PATH = re.compile(r"(?<![\w.~$}>-])/(?:work|tmp|root|home|usr/local|mnt|opt|data)/")
OUTSIDE = re.compile(r"\.library|anchors/|\bshared/anchors")
RELATIVE = re.compile(r"(?<![\w.])((?:\.\./)+)([\w.-]+)")


def _text_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "Snakefile", *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in ("benchmarks", "rules", "recipes", "scripts", "config", "profiles", "report", ".ci"):
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in {
            "", ".py", ".md", ".json", ".sh", ".smk", ".yaml", ".yml", ".txt", ".rst"} and "__pycache__" not in p.parts)
    return files


def _prose_of_python(path: Path) -> list[tuple[int, str]]:
    """The comments and docstrings of a Python file, with their line numbers."""
    source = path.read_text()
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return found


def _problems(path: Path, lineno: int, text: str) -> list[str]:
    where = f"{path.relative_to(ROOT)}:{lineno}"
    problems = [f"{where}: machine path {m.group(0)!r}" for m in MACHINE_PATH.finditer(text)]
    problems += [f"{where}: outside the repository {m.group(0)!r}" for m in OUTSIDE.finditer(text)]
    for m in RELATIVE.finditer(text):
        target = (path.parent / m.group(1) / m.group(2)).resolve()
        if not target.is_relative_to(ROOT):
            problems.append(f"{where}: {m.group(0)!r} leaves the repository")
    return problems


def _scan(text: str, path: Path, first_line: int = 1) -> list[str]:
    return [p for i, line in enumerate(text.splitlines(), first_line) for p in _problems(path, i, line)]


def test_docs_benchmarks_rules_and_recipes_name_no_machine_path():
    problems = [p for path in _text_files() for p in _scan(path.read_text(), path)]
    assert not problems, "\n".join(problems)


def test_llmbuild_comments_and_docstrings_name_no_machine_path():
    problems = []
    for path in sorted((ROOT / "llmbuild").rglob("*.py")):
        for lineno, text in _prose_of_python(path):
            problems += _scan(text, path, lineno)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("line", ["models in /work/models", "see ../shared/anchors/tpumlir/setup.sh",
                                  "written to /tmp/x.json", "cd ../../elsewhere", "the .library folder"])
def test_the_patterns_catch_what_they_are_for(line):
    assert _problems(ROOT / "docs" / "x.md", 1, line)


@pytest.mark.parametrize("line", ["/usr/bin/time -v llmbuild run", "2>/dev/null", "/proc/self/status",
                                  "/etc/slurm/slurm.conf", "../numerics/kernels.py", "$HOME/x", "build/tmp/x"])
def test_the_patterns_allow_system_tools_and_paths_inside(line):
    assert not _problems(ROOT / "docs" / "x.md", 1, line)

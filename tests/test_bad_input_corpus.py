"""The kept bad-input corpus (tests/corpus/make_corpus.py): every malformed recipe and every broken
checkpoint makes `llmbuild prepare` exit 2 with one line on stderr that names the file and the line,
field or tensor, with no traceback and nothing written to the build folder."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from helpers import ROOT, snakemake

CORPUS = ROOT / "tests" / "corpus"
LINE = re.compile(r"^llmbuild: error: (?P<file>.+?):(?P<line>\d+): (?P<rest>.*)$")


def _script():
    spec = importlib.util.spec_from_file_location("make_corpus", CORPUS / "make_corpus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_corpus"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _prepare(recipe: Path, build: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, LLMBUILD_BUILD_DIR=str(build), HF_HUB_OFFLINE="1")
    env.pop("LLMBUILD_DEBUG", None)
    return subprocess.run(["llmbuild", "prepare", str(recipe)], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=120)


def _one_line_error(result: subprocess.CompletedProcess) -> str | None:
    """The single error line, or None when the exit status, the line count or a traceback is wrong."""
    lines = result.stderr.splitlines()
    if result.returncode != 2 or len(lines) != 1 or "Traceback" in result.stderr:
        return None
    return lines[0] if lines[0].startswith("llmbuild: error: ") else None


def _written(build: Path) -> list[str]:
    return [str(p.relative_to(build)) for p in build.rglob("*")] if build.exists() else []


def test_the_kept_corpus_is_what_the_script_writes() -> None:
    result = subprocess.run([sys.executable, str(CORPUS / "make_corpus.py"), "--check"], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr


def test_every_bad_recipe_gives_its_one_line(tmp_path: Path) -> None:
    expected = json.loads((CORPUS / "expected.json").read_text())
    assert len(expected) >= 60
    build = tmp_path / "build"

    def run(name: str) -> str | None:
        case = expected[name]
        result = _prepare(CORPUS / "recipes" / f"{name}.yaml", build, tmp_path)
        line = _one_line_error(result)
        match = LINE.match(line or "")
        if match is None:
            return f"{name}: exit {result.returncode}, stderr {result.stderr[-400:]!r}"
        named = (tmp_path / match["file"]).resolve()
        if named != (CORPUS / "recipes" / case["file"]).resolve() or int(match["line"]) != case["line"]:
            return f"{name}: names {match['file']}:{match['line']}, expected {case['file']}:{case['line']}"
        if case["message"] not in match["rest"]:
            return f"{name}: {match['rest']!r} lacks {case['message']!r}"
        return None

    with ThreadPoolExecutor(4) as pool:
        problems = [p for p in pool.map(run, sorted(expected)) if p]
    assert not problems, "\n".join(problems)
    assert _written(build) == []


def test_every_broken_checkpoint_gives_its_one_line(tmp_path: Path) -> None:
    cases = _script().make_checkpoint_cases(tmp_path)
    assert len(cases) >= 12
    build = tmp_path / "build"

    def run(item) -> str | None:
        case, checkpoint, recipe = item
        result = _prepare(recipe, build, tmp_path)
        line = _one_line_error(result)
        if line is None:
            return f"{case.name}: exit {result.returncode}, stderr {result.stderr[-400:]!r}"
        missing = [f for f in (f.format(ckpt=checkpoint) for f in case.fragments) if f not in line]
        return f"{case.name}: {line!r} lacks {missing}" if missing else None

    with ThreadPoolExecutor(4) as pool:
        problems = [p for p in pool.map(run, cases) if p]
    assert not problems, "\n".join(problems)
    assert _written(build) == []


def test_snakemake_ends_with_the_step_message_and_leaves_no_binary(tmp_path: Path) -> None:
    """Through the DAG: the last line on the terminal is the refusing step's own message and its log."""
    case, checkpoint, recipe = next(c for c in _script().make_checkpoint_cases(tmp_path)
                                    if c[0].name == "nan_in_layer_weight")
    build = tmp_path / "build"
    result = snakemake(build, case.name, recipes=recipe.parent, check=False)
    assert result.returncode != 0
    last = result.stderr.rstrip().splitlines()[-1]
    assert last.startswith("llmbuild: error: ") and all(f.format(ckpt=checkpoint) in last for f in case.fragments)
    assert last.endswith(f"(log: {build / case.name / 'logs' / 'prepare.log'})"), last
    assert not list(build.rglob("*.llmb")) and not (build / case.name / "spec.json").exists()

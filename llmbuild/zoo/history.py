"""The zoo's history: one JSON record per run in <build>/zoo/history/<run>.json (docs/zoo.md, "History"),
with the tool versions and the git revision that built it, so a change between two nights can be traced."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from llmbuild import LlmbuildError
from llmbuild.zoo.jsonio import read_json, write_json
from llmbuild.zoo.layout import ZooPaths

SCHEMA = 1
# The packages whose version can change a build's output or time.
PACKAGES = ("llmbuild", "snakemake", "xdsl", "numpy", "torch", "transformers", "safetensors", "gguf", "plotly")
SOURCE_DIR = Path(__file__).resolve().parent.parent.parent  # the checkout llmbuild runs from


def new_record(run: str, results: dict[str, dict]) -> dict:
    return {
        "schema": SCHEMA,
        "run": run,
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git": git_revision(SOURCE_DIR),
        "versions": versions(),
        "host": {"machine": platform.machine(), "python": platform.python_version(), "cores": _cores()},
        "recipes": results,
    }


def load(paths: ZooPaths) -> list[dict]:
    """Every record, oldest first (run ids are UTC timestamps)."""
    records = []
    for path in sorted(paths.history.glob("*.json")):
        record = read_json(path)
        if (not isinstance(record, dict) or not isinstance(record.get("run"), str)
                or not isinstance(record.get("recipes"), dict)
                or not all(isinstance(result, dict) for result in record["recipes"].values())):
            raise LlmbuildError(f"{path}: expected a zoo history record (an object with `run` and `recipes`)")
        records.append(record)
    return records


def write(paths: ZooPaths, record: dict) -> Path:
    path = paths.record(record["run"])
    write_json(path, record)
    return path


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def git_revision(folder: Path) -> dict[str, str | bool | None]:
    """HEAD and whether tracked files differ from it; None when the code is not a git checkout.
    --no-optional-locks: reading the state must not write the index."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "--no-optional-locks", "-C", str(folder), *args], capture_output=True,
                                  text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    revision = git("rev-parse", "HEAD")
    changes = git("status", "--porcelain", "--untracked-files=no") if revision else None
    return {"revision": revision, "dirty": bool(changes) if changes is not None else None}


def _cores() -> int | None:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

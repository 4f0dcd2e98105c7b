"""JSON files read with a one-line error naming the file (a corrupt record must not become a traceback)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise LlmbuildError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    except UnicodeDecodeError:
        raise LlmbuildError(f"{path}: not valid JSON (not UTF-8 text)") from None


def read_json_if_any(path: Path) -> Any:
    """The file's content, or None when it does not exist."""
    return read_json(path) if Path(path).is_file() else None


def write_json(path: Path, data: Any) -> None:
    """Written whole or not at all: a reader never sees half a record."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)

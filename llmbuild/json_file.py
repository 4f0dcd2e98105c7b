"""A checkpoint's JSON file (config.json, an index, a tokenizer config) read as one object, or one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LlmbuildError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LlmbuildError(f"{path}: cannot read JSON: {exc}") from None
    if not isinstance(data, dict):
        raise LlmbuildError(f"{path}: expected a JSON object")
    return data

"""An image file opened as RGB with Pillow, or one line saying why not (both families' preprocessing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError, one_line


def open_rgb(path: str | Path) -> Any:
    """The image in `path` as an RGB PIL image."""
    try:
        from PIL import Image
    except ImportError:
        raise LlmbuildError("reading images needs Pillow: pip install pillow") from None
    try:
        with Image.open(path) as image:
            rgb = image.convert("RGB")
    except FileNotFoundError:
        raise LlmbuildError(f"{path}: image file not found") from None
    except OSError as exc:
        raise LlmbuildError(f"{path}: not an image Pillow can read ({one_line(str(exc))})") from None
    return rgb

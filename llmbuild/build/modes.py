"""Which quantization modes the compiler builds today; the others are for `llmbuild estimate` only."""

from __future__ import annotations

from llmbuild import LlmbuildError
from llmbuild.recipe.schema import FLOAT_MODES, Recipe


def require_compiled_mode(recipe: Recipe) -> None:
    """Refuse, in one line, a recipe whose mode the recipe schema accepts but the compiler cannot build yet."""
    mode = recipe.quantization.mode
    if mode not in FLOAT_MODES:
        raise LlmbuildError(
            f"{recipe.path}: quantization.mode: {mode} is supported by `llmbuild estimate` only for now "
            f"(the compiler builds {', '.join(FLOAT_MODES)})"
        )

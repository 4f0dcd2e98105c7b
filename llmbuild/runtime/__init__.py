"""The runtime: loads a deployable binary and runs it on a simulated device (see model.py)."""

from __future__ import annotations

from pathlib import Path

from llmbuild import LlmbuildError


def resolve_binary(recipe_or_binary: str) -> Path:
    """A .llmb path, a build directory holding one, or a recipe name (build/<name>/<name>.llmb)."""
    p = Path(recipe_or_binary)
    if p.is_file():
        return p
    if p.is_dir():
        found = sorted(p.glob("*.llmb"))
        if found:
            return found[0]
        raise LlmbuildError(f"{p}: no .llmb binary in this directory")
    from llmbuild.locations import build_root

    candidate = build_root() / recipe_or_binary / f"{recipe_or_binary}.llmb"
    if candidate.is_file():
        return candidate
    raise LlmbuildError(
        f"{recipe_or_binary}: no binary found (looked for {candidate}); build it with "
        f"`snakemake --cores 2 {recipe_or_binary}`"
    )

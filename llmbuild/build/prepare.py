"""`llmbuild prepare RECIPE`: the checkpoint the build reads and the model spec."""

from __future__ import annotations

from llmbuild.build.paths import BuildPaths, write_spec
from llmbuild.frontend import open_source, prepare_checkpoint
from llmbuild.recipe.schema import Recipe


def prepare(recipe: Recipe) -> None:
    paths = BuildPaths.of(recipe)
    paths.root.mkdir(parents=True, exist_ok=True)
    prepare_checkpoint(recipe.source, paths.checkpoint)
    spec = open_source(recipe.source, paths.checkpoint).spec
    write_spec(spec, paths.spec)

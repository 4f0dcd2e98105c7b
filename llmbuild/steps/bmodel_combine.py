"""`llmbuild bmodel-combine RECIPE --layer I | --head | --model`: what `model_tool --combine` makes, written as
a stream (bmodel/combine.py), in stages: a layer's nets (one copy of its weights for its three stages), the
head nets, then every part into `<recipe>.bmodel`.

Apart from steps/bmodel.py, which builds the nets, because a combine job imports none of the compiler: a
real-size build runs one per layer, and the compiler's imports were most of each job's time.
"""

from __future__ import annotations

from pathlib import Path

from llmbuild.artifacts.paths import BuildPaths, read_spec
from llmbuild.bmodel.combine import combine_stream
from llmbuild.bmodel.flat_schema import load_schema
from llmbuild.recipe_types import Recipe
from llmbuild.steps import dag
from llmbuild.vendor_toolchain import locate


def combine_layer(recipe: Recipe, layer: int) -> None:
    paths = BuildPaths.of(recipe)
    target = paths.bmodel_layer(layer)
    target.parent.mkdir(parents=True, exist_ok=True)
    _combine([paths.bmodel_net(n) for n in dag.layer_net_names(recipe.bmodel.history, layer)], target)


def combine_head(recipe: Recipe) -> None:
    paths = BuildPaths.of(recipe)
    _combine([paths.bmodel_net(n) for n in dag.head_net_names(recipe.vision is not None)], paths.bmodel_head)


def combine_model(recipe: Recipe) -> None:
    paths = BuildPaths.of(recipe)
    spec = read_spec(paths.spec)
    parts = [paths.bmodel_head, *(paths.bmodel_layer(i) for i in range(spec.num_layers))]
    _combine(parts, paths.bmodel(recipe.name))


def _combine(parts: list[Path], target: Path) -> None:
    """`model_tool --combine`'s result, as a stream (bmodel/combine.py): a 7B's final combine holds its
    descriptions and one chunk, not twice the binary."""
    combine_stream(load_schema(locate().bmodel_schema), parts, target)
    print(f"{target.name}: {len(parts)} parts combined, {target.stat().st_size} bytes")

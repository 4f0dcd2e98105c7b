"""`llmbuild prepare RECIPE`: the checkpoint the build reads and the model spec."""

from __future__ import annotations

from llmbuild.build.paths import BuildPaths, write_spec
from llmbuild.frontend import open_source, prepare_checkpoint
from llmbuild.frontend.checkpoint_scan import scan_checkpoint
from llmbuild.frontend.hf import HFSource
from llmbuild.quant.scheme import QUANTIZED_PROJECTIONS
from llmbuild.recipe.schema import Recipe


def prepare(recipe: Recipe) -> None:
    paths = BuildPaths.of(recipe)
    paths.root.mkdir(parents=True, exist_ok=True)
    prepare_checkpoint(recipe.source, paths.checkpoint)
    source = open_source(recipe.source, paths.checkpoint)
    if isinstance(source, HFSource):
        # Before any step reads it: every tensor present with its shape, every float value finite.
        scan_checkpoint(source, _imported_projections(recipe, source.spec.num_layers))
    write_spec(source.spec, paths.spec)


def _imported_projections(recipe: Recipe, layers: int) -> frozenset[str]:
    """The projections a quantized checkpoint stores packed (its import checks them), by canonical name."""
    if recipe.quantization.origin != "checkpoint":
        return frozenset()
    return frozenset(f"layers.{i}.{proj}.weight" for i in range(layers) for proj in QUANTIZED_PROJECTIONS)

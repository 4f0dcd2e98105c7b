"""One layer's weights as the compiler consumes them: float, rounded to nearest, or from a quantized
checkpoint. Only this layer's tensors are read (a 7B build never holds the model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmbuild.artifacts.paths import BuildPaths
from llmbuild.frontend.sources import open_source
from llmbuild.frontend.spec import ModelSpec, TensorSource
from llmbuild.quant.checkpoint import QuantizedCheckpoint
from llmbuild.quant.quantize_layer import import_layer, quantize_layer
from llmbuild.quant.scheme import QUANTIZED_PROJECTIONS, recipe_scheme
from llmbuild.recipe_types import LIBRARY_METHODS, Recipe

Weights = dict[str, np.ndarray]


def quantized_checkpoint_dir(recipe: Recipe, paths: BuildPaths) -> Path | None:
    """The quantized checkpoint the build imports: the source itself, or what the quantize step wrote."""
    origin = recipe.quantization.origin
    if origin == "checkpoint":
        assert recipe.source.path is not None
        return Path(recipe.source.path)
    if origin in LIBRARY_METHODS:
        return paths.quantized
    return None


def tensor_source(recipe: Recipe, paths: BuildPaths) -> TensorSource:
    """Where the float tensors (embeddings, norms, biases, lm_head) are read from."""
    if recipe.quantization.origin in LIBRARY_METHODS:
        from llmbuild.frontend.hf import HFSource

        return HFSource(paths.quantized)
    return open_source(recipe.source, paths.checkpoint)


def layer_weights(recipe: Recipe, paths: BuildPaths, spec: ModelSpec, layer: int) -> tuple[Weights, Weights]:
    """(TopOp weights, device weights) of one layer; the same dict twice for float modes."""
    scheme = recipe_scheme(recipe.quantization)
    source = tensor_source(recipe, paths)
    qdir = quantized_checkpoint_dir(recipe, paths)
    names = spec.layer_tensor_names(layer)
    if scheme is None:
        weights = {name: source.tensor(name) for name in names}
        return weights, weights
    if qdir is None:
        return quantize_layer({name: source.tensor(name) for name in names}, layer, scheme)
    projections = {f"layers.{layer}.{proj}.weight" for proj in QUANTIZED_PROJECTIONS}
    floats = {name: source.tensor(name) for name in names if name not in projections}
    return import_layer(floats, layer, QuantizedCheckpoint(qdir), scheme)

"""The head nets' weights (RoPE tables, embedding, final norm, lm_head), as TopOp means them and as the
device stores them: what the head job writes and what its check compares against. A module of its own so
that the checks, which need the weights but not the compiler, do not rerun for a compiler change."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.artifacts.layer_weights import tensor_source
from llmbuild.artifacts.paths import BuildPaths
from llmbuild.families.spec import ModelSpec, TensorSource
from llmbuild.importer.nets import ROPE_COS, ROPE_SIN, head_weight_names, lm_head_weight
from llmbuild.importer.rope import rope_tables
from llmbuild.importer.shapes import Shapes
from llmbuild.numerics.stored import RowReader, materialize
from llmbuild.quant.quantize_layer import quantize_head
from llmbuild.quant.scheme import head_scheme
from llmbuild.recipe_types import Recipe

# Tensors larger than this in float32 are read by rows when the source can (HF safetensors).
STREAMED_BYTES = 256 << 20


def head_weights(recipe: Recipe, paths: BuildPaths, spec: ModelSpec, shapes: Shapes | None) -> tuple[dict, dict]:
    """(TopOp weights, device weights) of the head nets: the RoPE tables (for `shapes`' cache length; None:
    none, as the vendor's head nets take), the embedding, the final norm and lm_head; tables read by rows
    where they are large; lm_head rounded to nearest if the recipe says."""
    source = tensor_source(recipe, paths)
    weights: dict[str, Any] = {name: _head_tensor(source, name) for name in head_weight_names(spec)}
    if shapes is not None:
        weights[ROPE_COS], weights[ROPE_SIN] = rope_tables(spec, shapes.seq_length)
    head = head_scheme(recipe.quantization)
    if head is None:
        return weights, weights
    # Round to nearest over the whole table: a quantized lm_head is a small model's option (docs/design.md).
    return quantize_head({k: materialize(v) for k, v in weights.items()}, lm_head_weight(spec), head)


def _head_tensor(source: TensorSource, name: str) -> np.ndarray | RowReader:
    reader = getattr(source, "reader", None)
    if reader is not None and name in source.names():
        lazy = reader(name)
        if 4 * int(np.prod(lazy.shape)) > STREAMED_BYTES:
            return lazy
    return source.tensor(name)

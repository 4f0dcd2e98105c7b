"""A spec's tensor layout, as its family lays it out: what checkpoint readers, writers, the cost model
and the step sizing ask for by spec, without knowing which family it is."""

from __future__ import annotations

from llmbuild.families.registry import get_family
from llmbuild.families.spec import ModelSpec


def expected_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every canonical tensor of `spec` with its shape, in import order (embedding first)."""
    return get_family(spec.architecture).tensor_shapes(spec)


def layer_tensor_names(spec: ModelSpec, layer: int) -> list[str]:
    """Layer `layer`'s canonical tensor names in import order, as its family lays them out."""
    return [f"layers.{layer}.{name}" for name in get_family(spec.architecture).tensor_shapes_of_layer(spec, layer)]

"""The e2e step's declared memory follows what the host path keeps (steps/resources.py, runtime/host.py):
16 bits a weight for bf16 and f16 weights (as stored) and for a bf16 dequantizer's output, 4 for an f32
model and for an f16 dequantizer's output, which the host path keeps in float32."""

from __future__ import annotations

import pytest

from llmbuild.steps import dag
from llmbuild.steps.resources import HOST_CACHE, _host_kept_bytes, model_size


@pytest.mark.parametrize(("recipe", "per_weight"), [
    ("smollm2_135m_bf16", 2), ("smollm2_135m_w4", 2), ("llama_tiny_f16", 2), ("qwen2_tiny_f32", 4),
    ("llama_tiny_w8_rtn", 4),
])
def test_the_host_path_keeps_16_bits_a_weight_unless_it_computes_in_float32(recipe: str, per_weight: int) -> None:
    spec = dag.recipe_spec(recipe)
    size = model_size(spec)
    products = size.layer * size.layers + size.vocab_table  # every layer's weights and one (tied) table
    assert _host_kept_bytes(dag.recipe(recipe), spec, HOST_CACHE) == pytest.approx(per_weight * products, rel=0.02)

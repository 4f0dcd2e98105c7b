"""Declared memory (steps/resources.py). The e2e step's follows what the host path keeps (runtime/host.py):
16 bits a weight for bf16 and f16 weights (as stored) and for a bf16 dequantizer's output, 4 for an f32
model and for an f16 dequantizer's output, which the host path keeps in float32.
A vendor vocabulary net's stays within a job's limit."""

from __future__ import annotations

import pytest
from helpers import ROOT

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


@pytest.mark.parametrize(("config", "parts"), [
    ("qwen2_7b_instruct_gptq_int4", 2), ("qwen2_5_7b_instruct_awq", 2), ("llama3_8b_instruct_autoround_int4", 2),
    ("deepseek_r1_distill_qwen_1_5b", 1), ("smollm2_135m_instruct_bf16", 1),
])
def test_a_vocabulary_net_is_given_its_table_in_parts_only_past_the_job_limit(config: str, parts: int) -> None:
    """Whole, a table compiles to `llm_convert`'s own bytes; a 7B's would take the vendor's code generator
    past a job's 4 GiB (about four copies of a 1.09 GB bf16 table), in parts about three copies."""
    from llmbuild.frontend.config_spec import spec_from_hf_config_file
    from llmbuild.steps.resources import JOB_LIMIT_MB, bmodel_resources, vocab_table_parts

    spec = spec_from_hf_config_file(ROOT / "recipes" / "configs" / f"{config}.json")
    recipe = dag.recipe("qwen2_tiny_bf16")  # the table's element type is what the recipe contributes
    assert vocab_table_parts(recipe, spec) == parts
    assert bmodel_resources(recipe, spec, "net", "lm_head").mem_mb <= JOB_LIMIT_MB

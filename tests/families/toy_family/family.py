"""Toy "sandwich norm" family: the Llama block with an RMSNorm on each branch's output before it joins the
residual stream (the post-norms of Gemma 2 and OLMo 2), so two more weights per layer and a block that the
shared builder makes only through the family's `residual` hook.

    h   = x + norm_attn_out(attention(norm_in(x)))
    out = h + norm_mlp_out(mlp(norm_post(h)))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmbuild.families.family import BlockGraph, CostTerm, Family
from llmbuild.families.spec import ModelSpec

NAME = "toy_sandwich"
# The branch-output norms' names within a layer, by branch.
OUTPUT_NORMS = {"attn": "attn_output_norm.weight", "mlp": "mlp_output_norm.weight"}


@dataclass(frozen=True)
class SandwichFamily(Family):
    def layer_tensor_shapes(self, spec: ModelSpec) -> dict[str, tuple[int, ...]]:
        return super().layer_tensor_shapes(spec) | {name: (spec.hidden_size,) for name in OUTPUT_NORMS.values()}

    def residual(self, g: BlockGraph, residual: Any, branch: Any, spec: ModelSpec, prefix: str, part: str) -> Any:
        gamma = g.weight(prefix + OUTPUT_NORMS[part], (spec.hidden_size,))
        normed = g.rms_norm(branch, gamma, spec.rms_norm_eps, f"{prefix}{part}_output_norm")
        return g.add(residual, normed, f"{prefix}{part}_residual")

    def residual_cost(self, spec: ModelSpec, part: str) -> tuple[CostTerm, ...]:
        h = spec.hidden_size
        return (CostTerm(f"{part}_output_norm", "norm", h, gamma=h), *super().residual_cost(spec, part))


FAMILY = SandwichFamily(
    name=NAME,
    hf_model_types=(NAME,),
    gguf_architectures=(),
    hf_class="ToySandwichForCausalLM",  # no transformers class: the test's reference is numpy
    qkv_bias=False,
    qk_norm=False,
    hf_defaults={"max_position_embeddings": 256, "rms_norm_eps": 1e-6},
)

"""Qwen2 / Qwen2.5: Llama with biases on the q, k and v projections."""

from llmbuild.families.family import Family

FAMILY = Family(
    name="qwen2",
    hf_model_types=("qwen2",),
    gguf_architectures=("qwen2",),
    hf_class="Qwen2ForCausalLM",
    qkv_bias=True,
    qk_norm=False,
    # Qwen2Config's defaults (transformers 5).
    hf_defaults={"max_position_embeddings": 32768, "rms_norm_eps": 1e-6},
    # Sliding-window attention changes the mask; the compiler only does full causal attention.
    hf_unsupported_flags=("use_sliding_window",),
)

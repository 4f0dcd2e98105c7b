"""Qwen3 (dense): no biases, RMSNorm on each q and k head, and a head_dim stated explicitly."""

from llmbuild.families.family import Family

FAMILY = Family(
    name="qwen3",
    hf_model_types=("qwen3",),
    gguf_architectures=("qwen3",),
    hf_class="Qwen3ForCausalLM",
    qkv_bias=False,
    qk_norm=True,
    # Qwen3Config's defaults (transformers 5): head_dim is 128 when config.json leaves it out,
    # whatever hidden_size / num_attention_heads is.
    hf_defaults={"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "head_dim": 128},
    hf_unsupported_flags=("attention_bias", "use_sliding_window"),
)

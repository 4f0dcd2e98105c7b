"""Llama (and Llama-shaped models such as SmolLM2): no biases, no q/k norm.

llama.cpp permutes the q/k rows of `llama` GGUF files for its rotary layout; reading undoes it.
"""

from llmbuild.families.family import Family

FAMILY = Family(
    name="llama",
    hf_model_types=("llama",),
    gguf_architectures=("llama",),
    hf_class="LlamaForCausalLM",
    qkv_bias=False,
    qk_norm=False,
    # LlamaConfig's defaults (transformers 5).
    hf_defaults={"max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2, "rms_norm_eps": 1e-6},
    # Either adds biases (o_proj, MLP) that the canonical layout has no names for.
    hf_unsupported_flags=("attention_bias", "mlp_bias"),
    gguf_permutes_qk=True,
)

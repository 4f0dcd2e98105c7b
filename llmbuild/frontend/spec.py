"""The framework-independent description of a decoder-only transformer, and the tensor source protocol.

Every checkpoint reader (HF safetensors, GGUF, synthetic) produces a `ModelSpec` and a `TensorSource`
that serves tensors one at a time under canonical names, so the importer never holds a whole model.

Canonical tensor names follow Hugging Face's Llama layout without the ``model.`` prefix; linear weights
keep the HF layout ``[out_features, in_features]`` and every tensor comes back as float32:

    embed_tokens.weight                         [vocab, hidden]
    layers.{i}.input_layernorm.weight           [hidden]
    layers.{i}.self_attn.{q,k,v,o}_proj.weight  [out, in]
    layers.{i}.self_attn.{q,k,v}_proj.bias      [out]          (qkv_bias only)
    layers.{i}.self_attn.{q,k}_norm.weight      [head_dim]     (qk_norm only)
    layers.{i}.post_attention_layernorm.weight  [hidden]
    layers.{i}.mlp.{gate,up,down}_proj.weight   [out, in]
    norm.weight                                 [hidden]
    lm_head.weight                              [vocab, hidden] (absent when tie_word_embeddings)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class ModelSpec:
    architecture: str  # registry name: "qwen2", "llama", "qwen3"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    max_position_embeddings: int
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # HF rope_scaling dict flattened to sorted (key, value) pairs; () means plain RoPE.
    rope_scaling: tuple[tuple[str, object], ...] = field(default=())

    def layer_tensor_names(self, i: int) -> list[str]:
        p = f"layers.{i}."
        names = [p + "input_layernorm.weight"]
        for proj in ("q", "k", "v", "o"):
            names.append(f"{p}self_attn.{proj}_proj.weight")
        if self.qkv_bias:
            names += [f"{p}self_attn.{proj}_proj.bias" for proj in ("q", "k", "v")]
        if self.qk_norm:
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        names.append(p + "post_attention_layernorm.weight")
        names += [f"{p}mlp.{proj}_proj.weight" for proj in ("gate", "up", "down")]
        return names


class TensorSource(Protocol):
    """Serves one tensor at a time; implementations keep files memory-mapped, never the whole model."""

    spec: ModelSpec

    def tensor(self, name: str) -> np.ndarray:
        """The canonical tensor `name` as a float32 array; LlmbuildError naming it if absent or malformed."""
        ...

    def names(self) -> list[str]:
        """All canonical tensor names the checkpoint holds."""
        ...

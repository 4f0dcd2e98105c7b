"""The framework-independent description of a decoder-only transformer: every checkpoint reader produces a
`ModelSpec` and a `TensorSource` that serves its tensors one at a time under canonical names (so the
importer never holds a whole model), each family (llmbuild/families/<name>/) says how its configs become a
spec, and every phase after the reader works from them.

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

A family adds tensors of its own to a layer (family.py's `layer_tensor_shapes`; layout.py lists them).
What may differ between families beyond the dense block has a field here (`mlp`, `attention`,
`layer_state`, and for a hybrid of attention kinds `layer_types`, `linear_attention`, `rotary_dim`); each
defaults to the dense block and is left out of the JSON form while it does, so the spec.json and binaries of
every dense model stay as they were.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

# The kinds importer/nets.py's shared block builder compiles; the others have a name so that a family can
# state them (and be refused with a clear message) before they are compiled.
MLP_COMPILED = ("dense",)  # room for "moe"
ATTENTION_COMPILED = ("full",)  # room for "sliding"; "hybrid" is its family's own (families/qwen3_5/)
# A layer's attention kind in `layer_types`: full causal attention with a KV cache, or linear attention
# whose state (`layer_state`) has a fixed size.
LAYER_KINDS = ("full", "linear")
# Fields that are left out of the JSON form while they hold their default (see the module docstring).
_OMITTED_AT_DEFAULT = ("mlp", "attention", "layer_state", "layer_types", "linear_attention", "rotary_dim")


@dataclass(frozen=True)
class LinearAttention:
    """The shape of a linear-attention (Gated DeltaNet) layer: query/key heads and value heads with their
    sizes, and the causal convolution's kernel over the concatenated q, k, v channels."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim


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
    mlp: str = "dense"  # the feed-forward kind (MLP_COMPILED lists those compiled)
    attention: str = "full"  # the attention kind (ATTENTION_COMPILED lists those compiled)
    # State a linear-attention layer carries between steps instead of a KV cache, as (name, shape) pairs
    # (its convolution window and recurrent matrix); compiled by the family that states it.
    layer_state: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # Each layer's kind (LAYER_KINDS) where layers differ (`attention` "hybrid"); () when all are `attention`.
    layer_types: tuple[str, ...] = ()
    linear_attention: LinearAttention | None = None  # the linear layers' shape, where there are any
    rotary_dim: int = 0  # rotary embedding on the first rotary_dim dimensions of a head; 0: all head_dim

    def layer_kind(self, layer: int) -> str:
        """Layer `layer`'s attention kind: "full" or "linear"."""
        return self.layer_types[layer] if self.layer_types else "full"

    @property
    def rope_dim(self) -> int:
        """The dimensions of a head the rotary embedding turns (the RoPE tables' width)."""
        return self.rotary_dim or self.head_dim


def spec_to_json(spec: ModelSpec) -> dict[str, Any]:
    """The spec's JSON form (spec.json, a binary's meta): its fields, less those at their default that
    older specs did not have, so a dense model's JSON is what it always was."""
    data = asdict(spec)
    for name in _OMITTED_AT_DEFAULT:
        if data[name] == ModelSpec.__dataclass_fields__[name].default:
            del data[name]
    return data


def spec_from_json(data: dict[str, Any]) -> ModelSpec:
    """A ModelSpec from its JSON form (lists back to tuples); TypeError on unknown or missing fields."""
    d = dict(data)
    d["eos_token_ids"] = tuple(d.get("eos_token_ids") or ())
    d["rope_scaling"] = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in d.get("rope_scaling") or ())
    d["layer_state"] = tuple((str(name), tuple(shape)) for name, shape in d.get("layer_state") or ())
    d["layer_types"] = tuple(d.get("layer_types") or ())
    if isinstance(d.get("linear_attention"), dict):
        d["linear_attention"] = LinearAttention(**d["linear_attention"])
    return ModelSpec(**d)


class TensorSource(Protocol):
    """Serves one tensor at a time; implementations keep files memory-mapped, never the whole model."""

    spec: ModelSpec

    def tensor(self, name: str) -> np.ndarray:
        """The canonical tensor `name` as a float32 array; LlmbuildError naming it if absent or malformed."""
        ...

    def names(self) -> list[str]:
        """All canonical tensor names the checkpoint holds."""
        ...

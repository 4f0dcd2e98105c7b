"""Qwen3.5's text model (transformers' `qwen3_5_text`, the language model of `qwen3_5` and of MiniCPM-V 4.6):
a hybrid of Gated DeltaNet linear-attention layers and gated full-attention layers, in the order the
config's `layer_types` lists (by default three linear layers, then one full, repeated).

- A linear layer (`linear_attn.*`) keeps a fixed-size state instead of a KV cache: the last K - 1 rows of
  its convolution's input ("conv", [K - 1, conv_dim]) and a recurrent matrix per value head ("recurrent",
  [Hv, dk, dv]); mixers.py builds it.
- A full layer is Qwen3's attention with two changes: q_proj also gives a gate per output element
  (sigmoid, on the attention's output) and the rotary embedding turns the first `partial_rotary_factor`
  of each head only (`rotary_dim`).
- Every RMSNorm but the linear layer's output norm scales by (1 + weight) (transformers'
  Qwen3_5RMSNorm, whose weights start at zero): read as gamma = 1 + weight, so the shared RMSNorm applies.
  `linear_attn.A_log` is read as the decay rate A = -exp(A_log) the layer multiplies by (transformers
  computes the same product in float32 on every call).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from llmbuild import ConfigFieldError, LlmbuildError
from llmbuild.families.family import BlockGraph, Family, Projection, StageShapes
from llmbuild.families.qwen3_5 import mixers
from llmbuild.families.spec import LinearAttention, ModelSpec

NAME = "qwen3_5"
# transformers' layer_types words -> the spec's layer kinds.
_KINDS = {"linear_attention": "linear", "full_attention": "full"}
# Norms transformers scales by (1 + weight); the linear layer's `linear_attn.norm` scales by weight.
_ONE_CENTRED = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
                "self_attn.k_norm.weight")
# Fields of rope_parameters the spec states otherwise (rotary_dim) or that only move vision tokens' positions
# (a text token's three rotary sections have the same position, so the sections change nothing).
_ROPE_HANDLED = ("partial_rotary_factor", "mrope_section", "mrope_interleaved")
# The linear-attention shape's config fields and Qwen3_5TextConfig's defaults for them (transformers 5).
_LINEAR_FIELDS = {"linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
                  "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}
STATE_NAMES = ("conv", "recurrent")
# Why a recipe of this family builds no vendor bmodel (recipe/cross_rules.py refuses bmodel.build true).
NO_VENDOR_EXPORT = ("architecture qwen3_5 (its linear-attention layers, a gated delta rule over a carried state, "
                    "have no export to the vendor's top dialect)")


def _one_centred(name: str) -> bool:
    return name == "norm.weight" or (name.startswith("layers.") and name.split(".", 2)[2] in _ONE_CENTRED)


@dataclass(frozen=True)
class Qwen35Family(Family):
    # ---- config.json ------------------------------------------------------------------------------

    def text_config(self, cfg: Mapping[str, Any]) -> dict[str, Any]:
        """The whole model's config (`qwen3_5`, the vision-language upload) -> its `text_config`, with the
        tying and token ids it sets at the top level; a `qwen3_5_text` config as it is."""
        text = cfg.get("text_config")
        if cfg.get("model_type") != "qwen3_5" or not isinstance(text, dict):
            return dict(cfg)
        return {**{k: cfg[k] for k in ("tie_word_embeddings", "bos_token_id", "eos_token_id") if k in cfg}, **text}

    def spec_from_hf_config(self, cfg: Mapping[str, Any], *, origin: str = "config.json") -> ModelSpec:
        cfg = self.text_config(cfg)
        rope = dict(cfg.get("rope_parameters") or {})
        partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
        plain = {k: v for k, v in cfg.items() if k not in ("layer_types", "partial_rotary_factor")}
        plain["rope_parameters"] = {k: v for k, v in rope.items() if k not in _ROPE_HANDLED}
        spec = super().spec_from_hf_config(plain, origin=origin)

        def field(key: str) -> int:
            value = cfg.get(key, _LINEAR_FIELDS[key])
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigFieldError(f"{origin}: {key} must be a positive integer, got {value!r}", key)
            return value

        linear = LinearAttention(field("linear_num_key_heads"), field("linear_num_value_heads"),
                                 field("linear_key_head_dim"), field("linear_value_head_dim"),
                                 field("linear_conv_kernel_dim"))
        if linear.num_value_heads % linear.num_key_heads:
            raise ConfigFieldError(f"{origin}: linear_num_value_heads: expected a multiple of linear_num_key_heads "
                                   f"({linear.num_key_heads}), got {linear.num_value_heads}", "linear_num_value_heads")
        rotary = _rotary_dim(partial, spec.head_dim, origin)
        kinds = _layer_kinds(cfg, spec.num_layers, origin)
        state = (("conv", (linear.conv_kernel - 1, linear.conv_dim)),
                 ("recurrent", (linear.num_value_heads, linear.key_head_dim, linear.value_head_dim)))
        return replace(spec, attention="hybrid", layer_types=kinds, linear_attention=linear,
                       rotary_dim=0 if rotary == spec.head_dim else rotary, layer_state=state)

    def transform_hf_tensor(self, name: str, array: np.ndarray, spec: ModelSpec) -> np.ndarray:
        if _one_centred(name):
            return (np.float32(1) + array).astype(np.float32)
        if name.endswith(".linear_attn.A_log"):
            return (-np.exp(array.astype(np.float32))).astype(np.float32)
        return array

    # ---- tensor layout ----------------------------------------------------------------------------

    def tensor_shapes_of_layer(self, spec: ModelSpec, layer: int) -> dict[str, tuple[int, ...]]:
        h, ffn = spec.hidden_size, spec.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {"input_layernorm.weight": (h,)}
        if spec.layer_kind(layer) == "linear":
            la = _linear(spec)
            shapes |= {
                "linear_attn.in_proj_qkv.weight": (la.conv_dim, h),
                "linear_attn.in_proj_z.weight": (la.value_dim, h),
                "linear_attn.in_proj_b.weight": (la.num_value_heads, h),
                "linear_attn.in_proj_a.weight": (la.num_value_heads, h),
                "linear_attn.conv1d.weight": (la.conv_dim, 1, la.conv_kernel),
                "linear_attn.dt_bias": (la.num_value_heads,),
                "linear_attn.A_log": (la.num_value_heads,),
                "linear_attn.norm.weight": (la.value_head_dim,),
                "linear_attn.out_proj.weight": (h, la.value_dim),
            }
        else:
            q, kv, d = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.head_dim
            shapes |= {
                "self_attn.q_proj.weight": (2 * q, h),  # each head's query, then its output gate
                "self_attn.k_proj.weight": (kv, h),
                "self_attn.v_proj.weight": (kv, h),
                "self_attn.o_proj.weight": (h, q),
                "self_attn.q_norm.weight": (d,),
                "self_attn.k_norm.weight": (d,),
            }
        shapes["post_attention_layernorm.weight"] = (h,)
        shapes |= {"mlp.gate_proj.weight": (ffn, h), "mlp.up_proj.weight": (ffn, h), "mlp.down_proj.weight": (h, ffn)}
        return shapes

    def layer_tensor_shapes(self, spec: ModelSpec) -> dict[str, tuple[int, ...]]:
        raise LlmbuildError(f"{self.name}: layers differ by kind; ask tensor_shapes_of_layer for one layer")

    def synthetic_tensor(self, rng: np.random.Generator, name: str, shape: tuple[int, ...], spec: ModelSpec,
                         draw: Callable[[], np.ndarray]) -> np.ndarray:
        """The shared draw, in this checkpoint's convention (a (1 + weight) norm stores the drawn gamma
        less one), and the linear layers' own: decay rates and time-step biases in transformers' initial
        ranges, the convolution's taps at unit gain over the kernel."""
        if _one_centred(name):
            return (draw() - np.float32(1)).astype(np.float32)
        if name.endswith(".linear_attn.A_log"):
            return np.log(rng.uniform(1.0, 16.0, size=shape)).astype(np.float32)
        if name.endswith(".linear_attn.dt_bias"):
            return rng.uniform(0.5, 1.5, size=shape).astype(np.float32)
        if name.endswith(".linear_attn.conv1d.weight"):
            return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])).astype(np.float32)
        return draw()

    # ---- the decoder block ------------------------------------------------------------------------

    def check_compiled(self, spec: ModelSpec) -> None:
        if spec.mlp != "dense" or spec.attention != "hybrid" or spec.linear_attention is None:
            raise LlmbuildError(f"{spec.architecture}: expected a dense MLP and hybrid attention with a linear "
                                f"attention shape, got mlp {spec.mlp!r}, attention {spec.attention!r}")
        if tuple(name for name, _ in spec.layer_state) != STATE_NAMES:
            raise LlmbuildError(f"{spec.architecture}: expected the per-layer state {', '.join(STATE_NAMES)}")

    def stage_inputs(self, g: BlockGraph, spec: ModelSpec, layer: int, shapes: StageShapes) -> dict[str, Any]:
        if spec.layer_kind(layer) == "full":
            return super().stage_inputs(g, spec, layer, shapes)
        return mixers.linear_inputs(g, spec, _linear(spec), shapes)

    def mixer(self, g: BlockGraph, x: Any, pos: Any, mask: Any, inputs: Mapping[str, Any], spec: ModelSpec,
              layer: int, shapes: StageShapes, linear: Projection) -> tuple[Any, dict[str, Any]]:
        if spec.layer_kind(layer) == "full":
            return mixers.gated_attention(g, x, pos, mask, inputs, spec, layer, shapes, linear)
        return mixers.gated_delta_net(g, x, inputs, spec, _linear(spec), layer, shapes, linear)


def _linear(spec: ModelSpec) -> LinearAttention:
    if spec.linear_attention is None:
        raise LlmbuildError(f"{spec.architecture}: the spec has no linear attention shape")
    return spec.linear_attention


def _rotary_dim(partial: Any, head_dim: int, origin: str) -> int:
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise ConfigFieldError(f"{origin}: partial_rotary_factor: expected a number in (0, 1], got {partial!r}",
                               "partial_rotary_factor")
    rotary = int(head_dim * partial)
    if rotary % 2:
        raise ConfigFieldError(f"{origin}: partial_rotary_factor: expected an even rotary dimension, got "
                               f"{rotary} of head_dim {head_dim}", "partial_rotary_factor")
    return rotary


def _layer_kinds(cfg: Mapping[str, Any], layers: int, origin: str) -> tuple[str, ...]:
    """Each layer's kind from `layer_types`, or from `full_attention_interval` (default 4) as transformers
    fills it in: every interval-th layer full, the others linear."""
    types = cfg.get("layer_types")
    if types is None:
        interval = cfg.get("full_attention_interval", 4)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval <= 0:
            raise ConfigFieldError(f"{origin}: full_attention_interval must be a positive integer, got "
                                   f"{interval!r}", "full_attention_interval")
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers:
        raise ConfigFieldError(f"{origin}: layer_types: expected a list of {layers} entries (num_hidden_layers), "
                               f"got {types!r}", "layer_types")
    for i, kind in enumerate(types):
        if kind not in _KINDS:
            raise ConfigFieldError(f"{origin}: layer_types[{i}]: expected one of {', '.join(_KINDS)}, got {kind!r}",
                                   f"layer_types[{i}]")
    return tuple(_KINDS[kind] for kind in types)


FAMILY = Qwen35Family(
    name=NAME,
    hf_model_types=("qwen3_5_text", "qwen3_5"),
    text_prefixes={"model.language_model.": ""},  # Qwen3_5ForConditionalGeneration's files
    gguf_architectures=(),
    hf_class="Qwen3_5ForCausalLM",
    qkv_bias=False,
    qk_norm=True,
    # Qwen3_5TextConfig's defaults (transformers 5) for the fields the shared reader takes.
    hf_defaults={"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "head_dim": 256, "rope_theta": 10000.0},
    hf_unsupported_flags=("attention_bias",),
    # The delta rule's state, kept in float32, is decayed and then takes a rank-1 update at every token.
    recurrence_roundings_per_token=2,
)

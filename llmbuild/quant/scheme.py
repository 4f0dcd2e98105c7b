"""What a recipe's quantization mode means to the compiler: weight bits, group size, activation type."""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmbuild import LlmbuildError

if TYPE_CHECKING:
    from llmbuild.recipe_types import QuantConfig

# Projections that take 4/8-bit weights; embeddings, norms, lm_head and the linear-attention layer's
# convolution taps keep the activation type. A layer has those of its kind (a Qwen3.5 linear-attention
# layer the `linear_attn.*` ones instead of `self_attn.*`): `layer_projections` picks them. Every product
# of an activation by a weight matrix is one (in_proj_b and in_proj_a too: the block builder's `linear`
# makes each an A16MatMul), so a layer's weight file has no float matrix left.
QUANTIZED_PROJECTIONS = (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
    "linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b", "linear_attn.in_proj_a",
    "linear_attn.out_proj",
)


def layer_projections(names: Container[str], layer: int, suffix: str = ".weight") -> tuple[str, ...]:
    """The QUANTIZED_PROJECTIONS layer `layer` has: those whose `layers.{layer}.{proj}{suffix}` is in
    `names` (its tensor names), in QUANTIZED_PROJECTIONS' order."""
    return tuple(p for p in QUANTIZED_PROJECTIONS if f"layers.{layer}.{p}{suffix}" in names)


@dataclass(frozen=True)
class QuantScheme:
    bits: int
    group_size: int  # -1: per channel (one group of K)
    act_dtype: str  # bf16 | f16
    # Act order: every projection's input rows are permuted (a `.perm` weight gathers the activations).
    act_order: bool = False
    # Round-to-nearest 8-bit is symmetric per channel (the incumbent's choice); imported and library
    # 8-bit weights keep their groups.
    per_channel_8bit: bool = True

    def group_for(self, in_features: int) -> int:
        if (self.bits == 8 and self.per_channel_8bit) or self.group_size == -1:
            return in_features
        if in_features % self.group_size:
            raise LlmbuildError(f"quantization.group_size: {self.group_size} does not divide in_features {in_features}")
        return self.group_size


def activation_dtype(mode: str) -> str:
    """f32/bf16/f16 modes compute in themselves; w4bf16 etc. in their activation type."""
    return mode[2:] if mode.startswith(("w4", "w8")) else mode


def scheme_for(mode: str, group_size: int) -> QuantScheme | None:
    if not mode.startswith(("w4", "w8")):
        return None
    return QuantScheme(bits=int(mode[1]), group_size=group_size, act_dtype=activation_dtype(mode))


def recipe_scheme(q: QuantConfig) -> QuantScheme | None:
    """The scheme a loaded recipe's quantization section means (None for float modes)."""
    base = scheme_for(q.mode, q.group_size)
    if base is None or q.origin == "rtn":
        return base
    act_order = q.checkpoint.desc_act if q.checkpoint is not None else (q.origin == "gptq" and q.desc_act)
    return QuantScheme(bits=base.bits, group_size=q.group_size, act_dtype=base.act_dtype, act_order=act_order,
                       per_channel_8bit=False)


def head_scheme(q: QuantConfig) -> QuantScheme | None:
    """lm_head's quantization (quantization.lm_head): round-to-nearest, w8 per channel, w4 in groups."""
    if q.lm_head == "float" or not q.mode.startswith("w"):
        return None
    return QuantScheme(bits=int(q.lm_head[1]), group_size=q.group_size if q.lm_head == "w4" else -1,
                       act_dtype=activation_dtype(q.mode))

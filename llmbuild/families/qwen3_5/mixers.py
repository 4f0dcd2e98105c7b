"""Qwen3.5's two token mixers on the shared block builder's graph (families/family.py's `BlockGraph`):
the Gated DeltaNet linear attention with its carried state, and the gated full attention.

A linear layer's stages (transformers' Qwen3_5GatedDeltaNet, written as TopOp):

    qkv, z, b, a = x W_qkv, x W_z, x W_b, x W_a
    window       = [conv state ; qkv]    (prefill: K - 1 rows of zeros instead of the state)
    q, k, v      = split(silu(causal_conv1d(window)))          q, k to unit rows (L2Norm)
    beta, g      = sigmoid(b), A * softplus(a + dt_bias)       A = -exp(A_log), read so
    o, S         = gated_delta_rule(q, k, v, g, beta, S)       chunks of 64 (decode: one token)
    out          = (rmsnorm(o) * silu(z)) W_out

The state lives where a full layer's KV cache would (the memory plan's `kv` region, bound as the inputs
`state_conv` and `state_recurrent`): a stage reads it in place and gives its new rows `present_conv` (the
qkv rows, whose last K - 1 real rows the runtime shifts into the window) and the new state
`present_recurrent` (which the runtime copies over the old). A prefill's padding rows after the real tokens
must not reach the state: `token_mask` (1 for a real row, 0 for padding) zeroes their beta and g, so their
update is the identity (S * exp(0) + k * 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmbuild.families.family import BlockGraph, Projection, StageShapes, rope_rows
from llmbuild.families.spec import LinearAttention, ModelSpec

CHUNK = 64  # tokens per chunk of the delta rule in a prefill (transformers' and the incumbent's)
L2_EPS = 1e-6  # transformers' l2norm inside the delta-rule kernel


def linear_inputs(g: BlockGraph, spec: ModelSpec, la: LinearAttention, shapes: StageShapes) -> dict[str, Any]:
    """A linear layer's extra inputs: the prefills' token mask, and the state of the stages on top of one."""
    inputs = {}
    if shapes.stage != "decode":
        inputs["token_mask"] = g.arg("token_mask", (1, shapes.tokens, 1))
    if shapes.stage != "prefill":
        inputs["state_conv"] = g.arg("state_conv", (1, la.conv_kernel - 1, la.conv_dim))
        inputs["state_recurrent"] = g.arg("state_recurrent",
                                          (1, la.num_value_heads, la.key_head_dim, la.value_head_dim))
    return inputs


def gated_delta_net(g: BlockGraph, x: Any, inputs: Mapping[str, Any], spec: ModelSpec, la: LinearAttention,
                    layer: int, shapes: StageShapes, linear: Projection) -> tuple[Any, dict[str, Any]]:
    n, H = shapes.tokens, spec.hidden_size
    hk, hv, dk, dv = la.num_key_heads, la.num_value_heads, la.key_head_dim, la.value_head_dim
    p = f"layers.{layer}."
    a_ = f"{p}linear_attn."
    qkv = linear(x, "linear_attn.in_proj_qkv", la.conv_dim, H, None, p + "qkv_proj")
    z = linear(x, "linear_attn.in_proj_z", la.value_dim, H, None, p + "z_proj")
    b = linear(x, "linear_attn.in_proj_b", hv, H, None, p + "b_proj")
    a = linear(x, "linear_attn.in_proj_a", hv, H, None, p + "a_proj")

    taps = g.weight(a_ + "conv1d.weight", (la.conv_dim, 1, la.conv_kernel))
    if "state_conv" in inputs:
        window = g.concat([inputs["state_conv"], qkv], 1, p + "conv_window")
        conv = g.causal_conv1d(window, taps, 0, p + "conv")
    else:
        conv = g.causal_conv1d(qkv, taps, la.conv_kernel - 1, p + "conv")
    conv = g.silu(conv, p + "conv_silu")
    q = g.reshape(g.slice(conv, 2, 0, la.key_dim, p + "q_split"), (1, n, hk, dk), p + "q_heads")
    k = g.reshape(g.slice(conv, 2, la.key_dim, 2 * la.key_dim, p + "k_split"), (1, n, hk, dk), p + "k_heads")
    v = g.reshape(g.slice(conv, 2, 2 * la.key_dim, la.conv_dim, p + "v_split"), (1, n, hv, dv), p + "v_heads")
    q = g.l2_norm(q, L2_EPS, p + "q_l2norm")
    k = g.l2_norm(k, L2_EPS, p + "k_l2norm")

    beta = g.sigmoid(b, p + "beta")
    rate = g.softplus(g.add(a, g.weight(a_ + "dt_bias", (hv,)), p + "dt"), p + "dt_softplus")
    decay = g.mul(rate, g.weight(a_ + "A_log", (hv,)), p + "decay")
    if "token_mask" in inputs:
        beta = g.mul(beta, inputs["token_mask"], p + "beta_mask")
        decay = g.mul(decay, inputs["token_mask"], p + "decay_mask")
    chunk = 1 if shapes.stage == "decode" else CHUNK
    packed = g.gated_delta_rule(q, k, v, decay, beta, inputs.get("state_recurrent"), chunk, dk**-0.5,
                                p + "delta_rule")
    # The state's dk rows first, then the tokens' outputs (op_defs/gated_delta_rule.py).
    state = g.permute(g.slice(packed, 1, 0, dk, p + "delta_state"), (0, 2, 1, 3), p + "state_heads")
    core = g.slice(packed, 1, dk, dk + n, p + "delta_out")

    normed = g.rms_norm(core, g.weight(a_ + "norm.weight", (dv,)), spec.rms_norm_eps, p + "out_norm")
    gate = g.silu(g.reshape(z, (1, n, hv, dv), p + "z_heads"), p + "z_silu")
    gated = g.reshape(g.mul(normed, gate, p + "out_gate"), (1, n, la.value_dim), p + "out_rows")
    o = linear(gated, "linear_attn.out_proj", H, la.value_dim, None, p + "out_proj")
    return o, {"present_conv": qkv, "present_recurrent": state}


def gated_attention(g: BlockGraph, x: Any, pos: Any, mask: Any, inputs: Mapping[str, Any], spec: ModelSpec,
                    layer: int, shapes: StageShapes, linear: Projection) -> tuple[Any, dict[str, Any]]:
    """Qwen3's attention with a sigmoid gate on its output (the second half of each head's q_proj rows) and
    the rotary embedding on the first `rotary_dim` dimensions of each head."""
    n, H, d = shapes.tokens, spec.hidden_size, spec.head_dim
    nh, kvh, r = spec.num_heads, spec.num_kv_heads, spec.rope_dim
    p = f"layers.{layer}."
    both = g.reshape(linear(x, "self_attn.q_proj", 2 * nh * d, H, None, p + "q_proj"), (1, n, nh, 2 * d),
                     p + "q_heads")
    q = g.slice(both, 3, 0, d, p + "q_split")
    gate = g.reshape(g.slice(both, 3, d, 2 * d, p + "gate_split"), (1, n, nh * d), p + "gate_rows")
    k = g.reshape(linear(x, "self_attn.k_proj", kvh * d, H, None, p + "k_proj"), (1, n, kvh, d), p + "k_heads")
    v = g.reshape(linear(x, "self_attn.v_proj", kvh * d, H, None, p + "v_proj"), (1, n, kvh, d), p + "v_heads")
    q = g.rms_norm(q, g.weight(p + "self_attn.q_norm.weight", (d,)), spec.rms_norm_eps, p + "q_norm")
    k = g.rms_norm(k, g.weight(p + "self_attn.k_norm.weight", (d,)), spec.rms_norm_eps, p + "k_norm")

    cos, sin = rope_rows(g, pos, n, shapes.seq_length, r, p)
    q = _partial_rope(g, q, cos, sin, r, d, p + "q")
    k = _partial_rope(g, k, cos, sin, r, d, p + "k")
    keys, values = k, v
    if "history_k" in inputs:
        keys = g.concat([inputs["history_k"], k], 1, p + "k_concat")
        values = g.concat([inputs["history_v"], v], 1, p + "v_concat")
    attn = g.attention(q, keys, values, mask, d**-0.5, p + "attention")
    attn = g.mul(attn, g.sigmoid(gate, p + "gate_sigmoid"), p + "attn_gate")
    o = linear(attn, "self_attn.o_proj", H, nh * d, None, p + "o_proj")
    return o, {"present_k": k, "present_v": v}


def _partial_rope(g: BlockGraph, x: Any, cos: Any, sin: Any, r: int, d: int, loc: str) -> Any:
    """The rotary embedding on the first r of d dimensions, the rest passed through."""
    if r == d:
        return g.rope(x, cos, sin, loc + "_rope")
    turned = g.rope(g.slice(x, 3, 0, r, loc + "_rot"), cos, sin, loc + "_rope")
    return g.concat([turned, g.slice(x, 3, r, d, loc + "_pass")], 3, loc + "_rope_join")

"""Qwen3.5's layers for the spec-level cost model (llmbuild/cost/): each kind's ops as `llmbuild estimate`
prices them, and each kind's activation values in the order mixers.py builds them, which cost/memory.py
places as assign-address does (liveness, first fit) to size the activation region without building a net.

A linear layer reads and writes its fixed-size state where a full layer reads its KV history: the window
and the recurrent matrix in place (`kv_bytes`), and the runtime's copy of the new state over the old.
"""

from __future__ import annotations

from llmbuild.cost.memory import history_values
from llmbuild.cost.ops import ADD_OPS, RMSNORM_OPS, ROPE_OPS, SILU_MUL_OPS, SOFTMAX_OPS, Attention, Op, _linear, _norm
from llmbuild.cost.weight_formats import WeightFormat
from llmbuild.families.spec import LinearAttention, ModelSpec
from llmbuild.numerics.formats import itemsize
from llmbuild.op_defs.active import ACTIVE
from llmbuild.op_defs.causal_conv1d import CAUSAL_CONV1D
from llmbuild.op_defs.gated_delta_rule import work as delta_rule_work
from llmbuild.op_defs.l2_norm import L2_NORM
from llmbuild.op_defs.mul import MUL

CHUNK = 64  # mixers.CHUNK: not imported, the cost layer sits below the importer's family hooks' use
ROPE_BYTES = 4  # the gathered cos/sin rows stay f32
STATE_BYTES = 4  # the recurrent state, and the delta rule's result that holds it, stay f32 (lower-top-to-tpu)

# (values read, the value defined or None, its bytes): one op of a net, in build order. Each value has a
# name of its own in the layer (a name defined twice would merge two lifetimes).
Value = tuple[list[str], str | None, int]


def _linear_attention(spec: ModelSpec) -> LinearAttention:
    assert spec.linear_attention is not None, "a qwen3_5 spec always states its linear attention"
    return spec.linear_attention


def layer_ops(spec: ModelSpec, fmt: WeightFormat, stage: str, seq_length: int, prefill_length: int,
              kind: str) -> tuple[Op, ...]:
    """The ops of one layer of `kind` ("linear" or "full") in `stage`."""
    n = 1 if stage == "decode" else prefill_length
    b = fmt.act_bytes
    H, F = spec.hidden_size, spec.intermediate_size
    ops = [_norm("input_norm", n, H, b, H)]
    ops += _linear_mixer(spec, fmt, stage, n) if kind == "linear" else _gated_attention(spec, fmt, stage, n,
                                                                                         seq_length)
    ops.append(Op("attn_residual", "elementwise", eu_ops=n * H * ADD_OPS))
    ops.append(_norm("post_norm", n, H, b, H))
    ops += [_linear("gate_proj", n, H, F, fmt, False), _linear("up_proj", n, H, F, fmt, False)]
    ops.append(Op("silu_mul", "elementwise", eu_ops=n * F * SILU_MUL_OPS))
    ops.append(_linear("down_proj", n, F, H, fmt, False))
    ops.append(Op("mlp_residual", "elementwise", eu_ops=n * H * ADD_OPS))
    return tuple(ops)


def _linear_mixer(spec: ModelSpec, fmt: WeightFormat, stage: str, n: int) -> list[Op]:
    la = _linear_attention(spec)
    H, b = spec.hidden_size, fmt.act_bytes
    hv, dk, dv, C, K = la.num_value_heads, la.key_head_dim, la.value_head_dim, la.conv_dim, la.conv_kernel
    window = (K - 1) * C * b
    state = hv * dk * dv * STATE_BYTES
    carried = stage != "prefill"
    flops, vector = delta_rule_work(n, hv, dk, dv, 1 if stage == "decode" else CHUNK)
    return [
        _linear("qkv_proj", n, H, C, fmt, False),
        _linear("z_proj", n, H, la.value_dim, fmt, False),
        _linear("b_proj", n, H, hv, fmt, False),
        _linear("a_proj", n, H, hv, fmt, False),
        Op("conv", "elementwise", eu_ops=n * C * (CAUSAL_CONV1D.vector_ops + ACTIVE.vector_ops),
           weight_bytes=C * K * b, kv_bytes=window if carried else 0),
        Op("qk_l2norm", "elementwise", eu_ops=2 * n * la.key_dim * L2_NORM.vector_ops),
        Op("gates", "elementwise", eu_ops=n * hv * (2 * ACTIVE.vector_ops + ADD_OPS + 3 * MUL.vector_ops),
           weight_bytes=2 * hv * b),
        Op("delta_rule", "matmul" if flops else "elementwise", flops=flops, eu_ops=vector,
           act_bytes=(2 * n * la.key_dim + 2 * n * la.value_dim) * b, kv_bytes=state if carried else 0),
        Op("out_norm_gate", "elementwise", eu_ops=n * la.value_dim * (RMSNORM_OPS + SILU_MUL_OPS),
           weight_bytes=dv * b),
        _linear("out_proj", n, la.value_dim, H, fmt, False),
        # The runtime moves the window over the new rows and copies the new state over the old.
        Op("state_store", "copy", act_bytes=2 * (window + n * C * b + state)),
    ]


def _gated_attention(spec: ModelSpec, fmt: WeightFormat, stage: str, n: int, seq_length: int) -> list[Op]:
    H, d, nh, kvh, r, b = (spec.hidden_size, spec.head_dim, spec.num_heads, spec.num_kv_heads, spec.rope_dim,
                           fmt.act_bytes)
    history = 0 if stage == "prefill" else seq_length
    att = Attention(n, history + n, nh, kvh, d, b)
    return [
        _linear("q_proj", n, H, 2 * nh * d, fmt, False),
        _linear("k_proj", n, H, kvh * d, fmt, False),
        _linear("v_proj", n, H, kvh * d, fmt, False),
        _norm("q_norm", n * nh, d, b, d), _norm("k_norm", n * kvh, d, b, d),
        Op("rope", "elementwise", eu_ops=n * (nh + kvh) * r * ROPE_OPS, act_bytes=2 * n * r * ROPE_BYTES),
        Op("attention", "attention", flops=4.0 * n * att.keys * nh * d, eu_ops=att.score_elems * SOFTMAX_OPS,
           act_bytes=(2 * n * nh * d + 2 * n * kvh * d + n * att.keys) * b, kv_bytes=2 * history * kvh * d * b,
           attention=att),
        Op("output_gate", "elementwise", eu_ops=n * nh * d * (ACTIVE.vector_ops + MUL.vector_ops)),
        _linear("o_proj", n, nh * d, H, fmt, False),
        Op("kv_store", "copy", act_bytes=2 * (2 * n * kvh * d * b)),
    ]


def block_values(spec: ModelSpec, act_dtype: str, stage: str, seq_length: int, prefill_length: int,
                 kind: str) -> list[Value]:
    """The activation values of one layer's `stage` net, op by op as mixers.py and the shared builder emit
    them after canonicalize. Inputs, weights and what is bound to IO (present_conv, present_recurrent,
    present_k, present_v, the new hidden state) are no activations; a Reshape is a view of its operand."""
    n = 1 if stage == "decode" else prefill_length
    H, F, b = spec.hidden_size, spec.intermediate_size, itemsize(act_dtype)
    ops: list[Value] = [([], "x1", n * H * b)]
    ops += _linear_values(spec, stage, n, b) if kind == "linear" else _attention_values(spec, stage, n, b,
                                                                                         seq_length)
    ops += [
        (["o"], "h", n * H * b),
        (["h"], "x2", n * H * b),
        (["x2"], "gate", n * F * b),
        (["x2"], "up", n * F * b),
        (["gate"], "act", n * F * b),
        (["act", "up"], "mul", n * F * b),
        (["mul"], "down", n * H * b),
        (["h", "down"], None, 0),
    ]
    return ops


def _linear_values(spec: ModelSpec, stage: str, n: int, b: int) -> list[Value]:
    la = _linear_attention(spec)
    hv, dk, dv, C, K = la.num_value_heads, la.key_head_dim, la.value_head_dim, la.conv_dim, la.conv_kernel
    kd, vd = la.key_dim, la.value_dim
    ops: list[Value] = [
        (["x1"], None, 0),  # qkv: bound to present_conv
        (["x1"], "z", n * vd * b),
        (["x1"], "b", n * hv * b),
        (["x1"], "a", n * hv * b),
    ]
    if stage != "prefill":
        ops += [([], "window", (K - 1 + n) * C * b), (["window"], "conv", n * C * b)]
    else:
        ops += [([], "conv", n * C * b)]
    ops += [
        (["conv"], "conv_silu", n * C * b),
        (["conv_silu"], "q", n * kd * b),
        (["conv_silu"], "k", n * kd * b),
        (["conv_silu"], "v", n * vd * b),
        (["q"], "q_l2", n * kd * b),
        (["k"], "k_l2", n * kd * b),
        (["b"], "beta", n * hv * b),
        (["a"], "dt", n * hv * b),
        (["dt"], "dt_softplus", n * hv * b),
        (["dt_softplus"], "decay", n * hv * b),
    ]
    beta, decay = "beta", "decay"
    if stage != "decode":
        ops += [(["beta"], "beta_mask", n * hv * b), (["decay"], "decay_mask", n * hv * b)]
        beta, decay = "beta_mask", "decay_mask"
    ops += [
        (["q_l2", "k_l2", "v", decay, beta], "packed", (dk + n) * hv * dv * STATE_BYTES),
        (["packed"], "state_rows", dk * hv * dv * STATE_BYTES),
        (["state_rows"], None, 0),  # the permuted state: bound to present_recurrent
        (["packed"], "core", n * vd * STATE_BYTES),  # a slice of the f32 result stays f32
        (["core"], "normed", n * vd * b),
        (["z"], "z_silu", n * vd * b),
        (["normed", "z_silu"], "gated", n * vd * b),
        (["gated"], "o", n * spec.hidden_size * b),
    ]
    return ops


def _attention_values(spec: ModelSpec, stage: str, n: int, b: int, seq_length: int) -> list[Value]:
    d, nh, kvh, r = spec.head_dim, spec.num_heads, spec.num_kv_heads, spec.rope_dim
    ops: list[Value] = [
        (["x1"], "qg", n * 2 * nh * d * b),
        (["qg"], "q", n * nh * d * b),
        (["qg"], "gate_half", n * nh * d * b),
        (["x1"], "k", n * kvh * d * b),
        (["x1"], None, 0),  # v: bound to present_v
        (["q"], "qn", n * nh * d * b),
        (["k"], "kn", n * kvh * d * b),
        ([], "cos", n * r * ROPE_BYTES),
        ([], "sin", n * r * ROPE_BYTES),
    ]
    if r < d:  # the rotary part sliced off, turned and joined with the rest again (k's join: present_k)
        for x, heads, joined in (("q", nh, "q_rope"), ("k", kvh, None)):
            ops += [
                ([f"{x}n"], f"{x}_rot", n * heads * r * b),
                ([f"{x}_rot", "cos", "sin"], f"{x}_turned", n * heads * r * b),
                ([f"{x}n"], f"{x}_pass", n * heads * (d - r) * b),
                ([f"{x}_turned", f"{x}_pass"], joined, n * heads * d * b if joined else 0),
            ]
    else:
        ops += [(["qn", "cos", "sin"], "q_rope", n * nh * d * b), (["kn", "cos", "sin"], None, 0)]
    history, keys_in = history_values(stage, seq_length, n, kvh * d * b)
    ops += [
        *history,
        (["q_rope", *keys_in], "attn", n * nh * d * b),
        (["gate_half"], "gate_sigmoid", n * nh * d * b),
        (["attn", "gate_sigmoid"], "attn_gated", n * nh * d * b),
        (["attn_gated"], "o", n * spec.hidden_size * b),
    ]
    return ops

"""The work of each compiled stage, op by op, from the model spec alone: what the MAC array and the
vector unit compute, and what must cross the DDR (weights, activations, KV history).

The op chain is the one `llmbuild.importer.nets` builds (RMSNorm, q/k/v projections with Qwen2 biases,
Qwen3 q/k norms, RoPE, attention over history + new rows, o projection, residual, RMSNorm, gate/up,
SiLU x up, down, residual), plus the runtime's copy of the new k/v rows into the cache. The residual joins
are the family's (its `residual_cost` states what its `residual` hook builds). Attention
score traffic is left to the schedule (`schedule.py`): it depends on whether scores leave local memory.

Vector-op counts per element are estimates (f32 on the vector unit); they only matter where vector
work rivals the matmuls (softmax over long prefills, dequantisation in decode).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmbuild.cost.weight_formats import WeightFormat
from llmbuild.families.family import CostTerm
from llmbuild.families.registry import family_part_if_any, get_family
from llmbuild.families.spec import LAYER_KINDS, ModelSpec
from llmbuild.op_defs.active import ACTIVE
from llmbuild.op_defs.add import ADD
from llmbuild.op_defs.mul import MUL
from llmbuild.op_defs.rms_norm import RMS_NORM
from llmbuild.op_defs.rotary_embedding import ROPE
from llmbuild.op_defs.softmax import SOFTMAX

# Per element, as each op's definition (llmbuild/op_defs/) counts them; SiLU x up is Active and a Mul.
RMSNORM_OPS = RMS_NORM.vector_ops
ROPE_OPS = ROPE.vector_ops
SILU_MUL_OPS = ACTIVE.vector_ops + MUL.vector_ops
ADD_OPS = ADD.vector_ops
SOFTMAX_OPS = SOFTMAX.vector_ops
# Flash attention, per query row and head and key block beyond the scores: the rescale factor (subtract,
# exp), the running sum's multiply-add; plus one multiply-add per accumulator element (d of them).
FLASH_RESCALE_OPS = 3
I32_BYTES = 4
LOGIT_BYTES = 4  # lm_head writes f32 logits

STAGE_NAMES = ("prefill", "prefill_kv", "decode")


@dataclass(frozen=True)
class Attention:
    """Shapes of one attention op: `queries` new rows attend to `keys` rows (history + new)."""

    queries: int
    keys: int
    heads: int
    kv_heads: int
    head_dim: int
    elem_bytes: int

    @property
    def score_elems(self) -> int:
        return self.heads * self.queries * self.keys

    @property
    def kv_rows_bytes(self) -> int:
        """K and V of all `keys` rows."""
        return 2 * self.keys * self.kv_heads * self.head_dim * self.elem_bytes


@dataclass(frozen=True)
class Op:
    name: str
    kind: str  # matmul | attention | elementwise | gather | copy
    flops: float = 0.0  # MAC-array work (2 per multiply-add)
    eu_ops: float = 0.0  # vector-unit element operations
    weight_bytes: float = 0.0  # weights (and embedding rows) read from DDR
    act_bytes: float = 0.0  # activations and IO read and written
    kv_bytes: float = 0.0  # KV-cache history read in place
    attention: Attention | None = None


@dataclass(frozen=True)
class Stage:
    """One compiled net kind, run `count` times per step (once per layer for the blocks)."""

    name: str  # embedding, block, block_kv, embedding_cache, block_cache, lm_head
    stage: str  # prefill, prefill_kv, decode or head
    count: int
    tokens: int
    ops: tuple[Op, ...]


def _linear(name: str, n: int, k: int, out: int, fmt: WeightFormat, bias: bool) -> Op:
    b = fmt.act_bytes
    return Op(
        name=name,
        kind="matmul",
        flops=2.0 * n * k * out,
        eu_ops=k * out * fmt.dequant_ops + (n * out * ADD_OPS if bias else 0),
        weight_bytes=fmt.matrix_bytes(out, k) + (out * b if bias else 0),
        act_bytes=(n * k + n * out) * b,
    )


def _norm(name: str, rows: int, width: int, b: int, gamma: int) -> Op:
    return Op(name, "elementwise", eu_ops=rows * width * RMSNORM_OPS, weight_bytes=gamma * b)


def _family_ops(terms: tuple[CostTerm, ...], rows: int, b: int) -> list[Op]:
    ops = []
    for term in terms:
        if term.kind == "norm":
            ops.append(_norm(term.name, rows, term.width, b, term.gamma))
        elif term.kind == "add":
            ops.append(Op(term.name, "elementwise", eu_ops=rows * term.width * ADD_OPS))
        else:
            raise ValueError(f"{term.name}: unknown cost term kind {term.kind!r} (expected add or norm)")
    return ops


def block_ops(spec: ModelSpec, fmt: WeightFormat, stage: str, seq_length: int, prefill_length: int) -> tuple[Op, ...]:
    """The ops of one layer's `stage` net (prefill: L new rows; prefill_kv: L rows over S history rows;
    decode: one row over S history rows; a static net reads all S rows whatever the position)."""
    if stage not in STAGE_NAMES:
        raise ValueError(f"unknown stage {stage!r}")
    n = 1 if stage == "decode" else prefill_length
    history = 0 if stage == "prefill" else seq_length
    H, d, nh, kvh, F = spec.hidden_size, spec.head_dim, spec.num_heads, spec.num_kv_heads, spec.intermediate_size
    b = fmt.act_bytes
    ops = [_norm("input_norm", n, H, b, H)]
    for proj, heads in (("q", nh), ("k", kvh), ("v", kvh)):
        ops.append(_linear(f"{proj}_proj", n, H, heads * d, fmt, spec.qkv_bias))
    if spec.qk_norm:
        ops += [_norm("q_norm", n * nh, d, b, d), _norm("k_norm", n * kvh, d, b, d)]
    # RoPE gathers n rows of the f32 cos and sin tables.
    ops.append(Op("rope", "elementwise", eu_ops=n * (nh + kvh) * d * ROPE_OPS, act_bytes=2 * n * d * 4))
    att = Attention(n, history + n, nh, kvh, d, b)
    ops.append(Op(
        "attention", "attention",
        flops=4.0 * n * att.keys * nh * d,
        eu_ops=att.score_elems * SOFTMAX_OPS,
        # q in, the new k/v rows, the output, and the additive mask [n, keys]
        act_bytes=(2 * n * nh * d + 2 * n * kvh * d + n * att.keys) * b,
        kv_bytes=2 * history * kvh * d * b,
        attention=att,
    ))
    ops.append(_linear("o_proj", n, nh * d, H, fmt, False))
    family = get_family(spec.architecture)
    ops += _family_ops(family.residual_cost(spec, "attn"), n, b)
    ops.append(_norm("post_norm", n, H, b, H))
    ops += [_linear("gate_proj", n, H, F, fmt, False), _linear("up_proj", n, H, F, fmt, False)]
    ops.append(Op("silu_mul", "elementwise", eu_ops=n * F * SILU_MUL_OPS))
    ops.append(_linear("down_proj", n, F, H, fmt, False))
    ops += _family_ops(family.residual_cost(spec, "mlp"), n, b)
    # The runtime copies the n new k/v rows (net outputs) into this layer's cache: read and write.
    ops.append(Op("kv_store", "copy", act_bytes=2 * (2 * n * kvh * d * b)))
    return tuple(ops)


def embedding_ops(spec: ModelSpec, fmt: WeightFormat, tokens: int) -> tuple[Op, ...]:
    """`fmt` is the table's own format (embedding_format): float, or a quantized tied lm_head's rows."""
    row = fmt.matrix_bytes(1, spec.hidden_size)
    return (Op("embed_tokens", "gather", weight_bytes=tokens * row, act_bytes=tokens * (row + I32_BYTES)),)


def lm_head_ops(spec: ModelSpec, fmt: WeightFormat) -> tuple[Op, ...]:
    """Final norm and the vocabulary projection of the last token; `fmt` is the head's own format."""
    H, V, b = spec.hidden_size, spec.vocab_size, fmt.act_bytes
    head = replace(_linear("lm_head", 1, H, V, fmt, False), act_bytes=H * b + V * LOGIT_BYTES)
    return (_norm("final_norm", 1, H, b, H), head)


# What a recipe's quantization.lm_head says (float, w8, w4), or "schedule": the schedule's own rule
# (Schedule.quantize_lm_head) for estimates made from a bare config.
LM_HEAD_CHOICES = ("float", "w8", "w4", "schedule")


def lm_head_format(spec: ModelSpec, fmt: WeightFormat, lm_head: str, schedule_quantizes: bool) -> WeightFormat:
    """The head's weights. A recipe's `lm_head` (w8: one group per output channel, w4: the layers' groups)
    applies to a tied head too: the table is then stored once, quantized, and the embedding reads its rows.
    "schedule": the layers' format for an untied head when the schedule quantizes heads, float otherwise."""
    if lm_head not in LM_HEAD_CHOICES:
        raise ValueError(f"lm_head must be one of {LM_HEAD_CHOICES}, got {lm_head!r}")
    if not fmt.quantized or lm_head == "float":
        return fmt.unquantized()
    if lm_head == "schedule":
        return fmt if schedule_quantizes and not spec.tie_word_embeddings else fmt.unquantized()
    return replace(fmt, weight_bits=int(lm_head[1]), group_size=fmt.group_size if lm_head == "w4" else -1)


def embedding_format(spec: ModelSpec, head_fmt: WeightFormat) -> WeightFormat:
    """The embedding table's format: the head's when the two are one tied (quantized) table, else float."""
    return head_fmt if spec.tie_word_embeddings and head_fmt.quantized else head_fmt.unquantized()


def model_stages(spec: ModelSpec, fmt: WeightFormat, seq_length: int, prefill_length: int,
                 head_fmt: WeightFormat) -> dict[str, Stage]:
    """Every net kind of a deployable model, by name; `head_fmt` is lm_head_format's."""
    N, L = spec.num_layers, prefill_length
    table_fmt = embedding_format(spec, head_fmt)

    def block(name: str, stage: str) -> Stage:
        tokens = 1 if stage == "decode" else L
        return Stage(name, stage, N, tokens, block_ops(spec, fmt, stage, seq_length, L))

    stages = {
        "embedding": Stage("embedding", "head", 1, L, embedding_ops(spec, table_fmt, L)),
        "block": block("block", "prefill"),
        "block_kv": block("block_kv", "prefill_kv"),
        "embedding_cache": Stage("embedding_cache", "head", 1, 1, embedding_ops(spec, table_fmt, 1)),
        "block_cache": block("block_cache", "decode"),
        "lm_head": Stage("lm_head", "head", 1, 1, lm_head_ops(spec, head_fmt)),
    }
    own = family_part_if_any(spec.architecture, "cost")
    if own is None or not hasattr(own, "layer_ops"):
        return stages
    # A family whose layers differ (a hybrid of attention kinds) prices each kind apart: `block` and its
    # stages for its full layers, `block_linear` and its stages for the others (STEPS runs both).
    for name, stage in (("block", "prefill"), ("block_kv", "prefill_kv"), ("block_cache", "decode")):
        tokens = 1 if stage == "decode" else L
        for kind, (_, count) in layer_kinds(spec).items():
            key = name if kind == "full" else f"{name}_{kind}"
            stages[key] = Stage(key, stage, count, tokens, own.layer_ops(spec, fmt, stage, seq_length, L, kind))
        if "full" not in layer_kinds(spec):
            stages[name] = Stage(name, stage, 0, tokens, ())
    return stages


def layer_kinds(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    """Each kind of layer the spec has: (its first layer, how many); a dense model's one kind, "full"."""
    kinds = spec.layer_types or ("full",) * spec.num_layers
    return {kind: (kinds.index(kind), kinds.count(kind)) for kind in dict.fromkeys(kinds)}


def model_steps(stages: dict[str, Stage]) -> dict[str, tuple[str, ...]]:
    """STEPS for these stages: each block stage followed by its other layer kinds' (`block_linear` after
    `block`), where a family's layers differ."""
    others = [kind for kind in LAYER_KINDS if kind != "full"]
    return {step: tuple(n for name in names
                        for n in (name, *(f"{name}_{k}" for k in others if f"{name}_{k}" in stages)))
            for step, names in STEPS.items()}


# The nets one step runs, in order: a first-token prefill, a decode step, a prefill with history.
STEPS = {
    "prefill": ("embedding", "block", "lm_head"),
    "decode": ("embedding_cache", "block_cache", "lm_head"),
    "prefill_kv": ("embedding", "block_kv", "lm_head"),
}

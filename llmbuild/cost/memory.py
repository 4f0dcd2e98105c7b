"""Device memory of a deployable model from its spec alone, region by region as the build lays it out.

It mirrors `llmbuild.codegen.memory_plan.make_plan` (weights, KV cache, IO; every tensor aligned to the
chip's global alignment, IO buffers to 64 bytes) and the activation region `link` adds (the largest net's
liveness-based first-fit peak, replayed here on the block's op chain). make_plan lowers real nets to
learn each weight's type; this needs no IR, so it takes milliseconds for any model size and also covers
the w4/w8 modes the compiler does not build yet (each linear weight as packed values, scales, zeros).
tests/test_cost_model.py checks the two agree on the tiny recipes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from llmbuild.cost.ops import embedding_format, layer_kinds
from llmbuild.cost.weight_formats import WeightFormat
from llmbuild.families.layout import expected_shapes
from llmbuild.families.registry import family_part_if_any, get_family
from llmbuild.families.spec import ModelSpec
from llmbuild.numerics.formats import itemsize

ACTIVATION_ALIGN = 64  # llmbuild.codegen.memory_plan.ACTIVATION_ALIGN (not imported: it pulls in the IR)
ROPE_BYTES = 4  # the cos/sin tables stay f32
STATE_F32_BYTES = 4  # a linear-attention layer's recurrent state stays f32


def align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class MemoryEstimate:
    regions: dict[str, int]  # weight, kv, io, activation: bytes each, aligned as the build aligns them
    limit_bytes: int  # the device memory the model may use
    details: dict[str, int] = field(default_factory=dict)  # weight bytes by part, for reports

    @property
    def total_bytes(self) -> int:
        return sum(self.regions.values())

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.limit_bytes

    def breakdown(self) -> str:
        """'2.21 GiB (weight 1.23 GiB, kv 0.22 GiB, ...)'"""
        parts = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in self.regions.items())
        return f"{self.total_bytes / 2**30:.2f} GiB ({parts})"

    def to_dict(self) -> dict:
        return {"regions": dict(self.regions), "total_bytes": self.total_bytes, "limit_bytes": self.limit_bytes,
                "fits": self.fits, "weight_details": dict(self.details)}


def _tensor_sizes(name: str, shape: tuple[int, ...], fmt: WeightFormat) -> list[int]:
    # A linear weight, or the embedding table when it is a quantized tied lm_head (else it is float).
    if len(shape) == 2 and (name != "embed_tokens.weight" or fmt.quantized):
        return [size for _, size in fmt.matrix_tensors(*shape)]
    n = fmt.act_bytes
    for s in shape:
        n *= s
    return [n]


def weight_region(spec: ModelSpec, fmt: WeightFormat, seq_length: int, head_fmt: WeightFormat,
                  alignment: int) -> tuple[int, dict[str, int]]:
    """(the weight region's size, bytes by part): RoPE tables, embedding, layers, final norm, lm_head;
    `head_fmt` is lm_head_format's."""
    shapes = expected_shapes(replace(spec, num_layers=1))  # the head's tensors (and one layer's)
    table_fmt = embedding_format(spec, head_fmt)
    parts = {"rope": 2 * align(seq_length * spec.rope_dim * ROPE_BYTES, alignment), "embedding": 0, "layers": 0,
             "head": 0}
    for name, shape in shapes.items():
        if name.startswith("layers."):
            continue
        part = "embedding" if name.startswith("embed") else "head"
        own = head_fmt if name == "lm_head.weight" else table_fmt if name == "embed_tokens.weight" else fmt
        parts[part] += sum(align(s, alignment) for s in _tensor_sizes(name, shape, own))
    family = get_family(spec.architecture)
    for first, count in layer_kinds(spec).values():  # the layers of one kind are alike
        for name, shape in family.tensor_shapes_of_layer(spec, first).items():
            parts["layers"] += count * sum(align(s, alignment) for s in _tensor_sizes(name, shape, fmt))
    return sum(parts.values()), parts


def kv_region(spec: ModelSpec, fmt: WeightFormat, seq_length: int, alignment: int) -> int:
    """A full layer's k and v caches [S, kv_heads, head_dim]; a linear-attention layer's state instead."""
    per_tensor = seq_length * spec.num_kv_heads * spec.head_dim * fmt.act_bytes
    kinds = layer_kinds(spec)
    total = 2 * kinds.get("full", (0, 0))[1] * align(per_tensor, alignment)
    state = sum(align(math.prod(shape) * state_bytes(name, fmt), alignment) for name, shape in spec.layer_state)
    return total + kinds.get("linear", (0, 0))[1] * state


def io_region(spec: ModelSpec, fmt: WeightFormat, seq_length: int, prefill_length: int, alignment: int) -> int:
    L, S, H, b = prefill_length, seq_length, spec.hidden_size, fmt.act_bytes
    kvd = spec.num_kv_heads * spec.head_dim
    sizes = (L * 4, L * H * b, L * H * b, L * 4, L * (S + L) * b, L * kvd * b, L * kvd * b, H * b,
             spec.vocab_size * 4)  # input_ids .. logits, as make_plan lists them
    if "linear" in spec.layer_types:  # the token mask, the new window rows and the new recurrent state
        state = dict(spec.layer_state)
        sizes += (L * b, L * state["conv"][1] * b, math.prod(state["recurrent"]) * state_bytes("recurrent", fmt))
    cursor = 0
    for size in sizes:
        cursor = align(cursor, ACTIVATION_ALIGN) + size
    return align(cursor, alignment)


def state_bytes(name: str, fmt: WeightFormat) -> int:
    """codegen/memory_plan.state_dtype's bytes (not imported: it pulls in the IR): the recurrent state f32."""
    return STATE_F32_BYTES if name == "recurrent" else fmt.act_bytes


def estimate_memory(spec: ModelSpec, fmt: WeightFormat, seq_length: int, prefill_length: int, alignment: int,
                    limit_bytes: int, head_fmt: WeightFormat) -> MemoryEstimate:
    weights, details = weight_region(spec, fmt, seq_length, head_fmt, alignment)
    activation = max(block_activation_peak(spec, fmt.act_dtype, stage, seq_length, prefill_length)
                     for stage in ("prefill", "prefill_kv", "decode"))
    activation = max(activation, align(spec.hidden_size * fmt.act_bytes, ACTIVATION_ALIGN))  # lm_head's norm
    regions = {
        "weight": weights,
        "kv": kv_region(spec, fmt, seq_length, alignment),
        "io": io_region(spec, fmt, seq_length, prefill_length, alignment),
        "activation": align(activation, alignment),
    }
    return MemoryEstimate(regions, limit_bytes, details)


# ---------------------------------------------------------------------------------------------
# Activations: assign-address's liveness first fit, replayed on the block's op chain


def _block_values(spec: ModelSpec, act_dtype: str, stage: str, seq_length: int,
                  prefill_length: int) -> list[tuple[int, list[str], str | None, int]]:
    """(op index, activation values it reads, the activation it defines or None, that value's bytes) in
    the order `build_block` emits the ops after canonicalize. Net inputs, weights and the outputs bound to
    IO (present_k, present_v, the new hidden state) are not activations and are left out."""
    n = 1 if stage == "decode" else prefill_length
    H, d, nh, kvh, F = spec.hidden_size, spec.head_dim, spec.num_heads, spec.num_kv_heads, spec.intermediate_size
    b, f32 = itemsize(act_dtype), ROPE_BYTES
    q_in, k_in = "q", "k"
    ops: list[tuple[list[str], str | None, int]] = [
        ([], "x1", n * H * b),
        (["x1"], "q", n * nh * d * b),
        (["x1"], "k", n * kvh * d * b),
        (["x1"], None, 0),  # v: bound to present_v
    ]
    if spec.qk_norm:
        ops += [(["q"], "qn", n * nh * d * b), (["k"], "kn", n * kvh * d * b)]
        q_in, k_in = "qn", "kn"
    ops += [
        ([], "cos", n * d * f32),  # gathered rows of the f32 tables stay f32
        ([], "sin", n * d * f32),
        ([q_in, "cos", "sin"], "q_rope", n * nh * d * b),
        ([k_in, "cos", "sin"], None, 0),  # k_rope: bound to present_k
    ]
    history, keys_in = history_values(stage, seq_length, n, kvh * d * b)
    ops += [
        *history,
        (["q_rope", *keys_in], "attn", n * nh * d * b),
        (["attn"], "o", n * H * b),
        (["o"], "h", n * H * b),
        (["h"], "x2", n * H * b),
        (["x2"], "gate", n * F * b),
        (["x2"], "up", n * F * b),
        (["gate"], "act", n * F * b),
        (["act", "up"], "mul", n * F * b),
        (["mul"], "down", n * H * b),
        (["h", "down"], None, 0),  # the new hidden state: bound to IO
    ]
    return [(i, reads, value, size) for i, (reads, value, size) in enumerate(ops)]


def history_values(stage: str, seq_length: int, n: int, row_bytes: int) -> tuple[list, list[str]]:
    """A full-attention layer's K and V joined to the history (the stages that read one): their entries in
    a block's value list, and their names for the attention that reads them."""
    if stage == "prefill":
        return [], []
    rows = (seq_length + n) * row_bytes
    return [([], "k_concat", rows), ([], "v_concat", rows)], ["k_concat", "v_concat"]


def block_activation_peak(spec: ModelSpec, act_dtype: str, stage: str, seq_length: int, prefill_length: int) -> int:
    """The activation bytes assign-address gives one layer's `stage` net (liveness, first fit): the largest
    of the layer kinds' where a family's layers differ (its `cost` part lists each kind's values)."""
    own = family_part_if_any(spec.architecture, "cost")
    if own is None or not hasattr(own, "block_values"):
        return _peak(_block_values(spec, act_dtype, stage, seq_length, prefill_length))
    return max(_peak([(i, *op) for i, op in enumerate(own.block_values(spec, act_dtype, stage, seq_length,
                                                                          prefill_length, kind))])
               for kind in layer_kinds(spec))


def _peak(values: list[tuple[int, list[str], str | None, int]]) -> int:
    live: dict[str, list[int]] = {}
    sizes: dict[str, int] = {}
    for index, reads, value, size in values:
        for r in reads:
            live[r][1] = index
        if value is not None:
            live[value] = [index, index]
            sizes[value] = size
    placed: list[tuple[int, int, int, int]] = []  # offset, size, start, end
    peak = 0
    for name, (start, end) in sorted(live.items(), key=lambda kv: (kv[1][0], -sizes[kv[0]])):
        size = align(sizes[name], ACTIVATION_ALIGN)
        offset = 0
        for lo, hi in sorted((o, o + s) for o, s, a, z in placed if not (z < start or a > end)):
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append((offset, size, start, end))
        peak = max(peak, offset + size)
    return peak

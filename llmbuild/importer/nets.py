"""TopOp nets of a decoder-only transformer, with the static signatures of the three stages.

Net names follow the incumbent: `embedding`, `embedding_cache`, `block_{i}` (prefill),
`block_kv_{i}` (prefill with history), `block_cache_{i}` (decode) and `lm_head`. The op chain of one
block is the Llama/Qwen2 one; Qwen2's q/k/v bias and Qwen3's q/k RMSNorm are flags of the spec, so a
family variant needs no new code here. Where a family's block differs in structure, the builder asks the
family (llmbuild/families/family.py's hooks: the stage's extra inputs, the token mixer with the outputs the
runtime keeps, the residual joins, the gated activation), found through the registry by the spec's
architecture.
"""

from __future__ import annotations

from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, i32, i64
from xdsl.ir import SSAValue

from llmbuild.dialects import common
from llmbuild.families.family import ROPE_COS, ROPE_SIN, StageShapes
from llmbuild.families.registry import get_family
from llmbuild.families.spec import ModelSpec
from llmbuild.importer.graph import TopGraph
from llmbuild.importer.shapes import Shapes
from llmbuild.quant.scheme import QuantScheme

STAGES = ("prefill", "prefill_kv", "decode")
STAGE_NET = {"prefill": "block_{}", "prefill_kv": "block_kv_{}", "decode": "block_cache_{}"}


def block_net_name(layer: int, stage: str) -> str:
    return STAGE_NET[stage].format(layer)


def _module_attrs(net: str, stage: str, layer: int) -> dict:
    return {"top.net": StringAttr(net), "top.stage": StringAttr(stage), "top.layer": IntegerAttr(layer, i64)}


def build_block(spec: ModelSpec, layer: int, stage: str, shapes: Shapes, quant: QuantScheme | None = None) -> ModuleOp:
    """One layer's net for one stage. With `quant`, the seven projections are `top.A16MatMul` over 4/8-bit
    levels (weights `<proj>.qweight|scales|zeros`); otherwise `top.MatMul` over float weights.

    Act order (`quant.act_order`): the checkpoint's input rows were sorted so that groups are contiguous
    (quant/pack.py); each projection's input is gathered with the same permutation (`<proj>.perm`), which
    keeps x · Wᵀ exact without re-quantizing anything."""
    family = get_family(spec.architecture)
    family.check_compiled(spec)
    net = block_net_name(layer, stage)
    g = TopGraph(net, _module_attrs(net, stage, layer))

    def linear(x: SSAValue, proj: str, n: int, k: int, bias: SSAValue | None, loc: str) -> SSAValue:
        p = f"layers.{layer}."
        if quant is None:
            return g.linear(x, g.weight(f"{p}{proj}.weight", (n, k)), bias, loc)
        if quant.act_order:
            perm = g.weight(f"{p}{proj}.perm", (k,), i32)
            x = g.gather(x, perm, loc + "_act_order", axis=len(common.shape_of(x)) - 1)
        return g.a16_linear(x, f"{p}{proj}", n, k, quant.group_for(k), quant.bits, bias, loc)

    n, H = shapes.stage_tokens(stage), spec.hidden_size
    p = f"layers.{layer}."
    stage_shapes = StageShapes(stage, n, shapes.seq_length, shapes.stage_keys(stage))

    hidden = g.arg("hidden_states", (1, n, H))
    pos = g.arg("position_ids", (1, n), i32)
    mask = g.arg("attention_mask", (1, 1, n, shapes.stage_keys(stage)))
    inputs = family.stage_inputs(g, spec, layer, stage_shapes)

    x = g.rms_norm(hidden, g.weight(p + "input_layernorm.weight", (H,)), spec.rms_norm_eps, p + "input_norm")
    o, kept = family.mixer(g, x, pos, mask, inputs, spec, layer, stage_shapes, linear)
    h = family.residual(g, hidden, o, spec, p, "attn")

    x = g.rms_norm(h, g.weight(p + "post_attention_layernorm.weight", (H,)), spec.rms_norm_eps, p + "post_norm")
    F = spec.intermediate_size
    gate = linear(x, "mlp.gate_proj", F, H, None, p + "gate_proj")
    up = linear(x, "mlp.up_proj", F, H, None, p + "up_proj")
    act = family.gated_activation(g, gate, up, p)
    down = linear(act, "mlp.down_proj", H, F, None, p + "down_proj")
    out = family.residual(g, h, down, spec, p, "mlp")
    return g.finish([out, *kept.values()], ["hidden_states", *kept])


def build_embedding(spec: ModelSpec, tokens: int, net: str, head: QuantScheme | None = None) -> ModuleOp:
    """Embedding lookup; with a quantized lm_head over tied embeddings, from the same quantized table."""
    g = TopGraph(net, _module_attrs(net, "head", -1))
    ids = g.arg("input_ids", (1, tokens), i32)
    V, H = spec.vocab_size, spec.hidden_size
    if head is not None and spec.tie_word_embeddings:
        rows = g.a16_gather("embed_tokens", V, H, head.group_for(H), head.bits, ids, "embed_tokens")
    else:
        rows = g.gather(g.weight("embed_tokens.weight", (V, H)), ids, "embed_tokens")
    return g.finish([rows], ["hidden_states"])


def build_lm_head(spec: ModelSpec, head: QuantScheme | None = None) -> ModuleOp:
    g = TopGraph("lm_head", _module_attrs("lm_head", "head", -1))
    H, V = spec.hidden_size, spec.vocab_size
    x = g.arg("hidden_states", (1, H))
    x = g.rms_norm(x, g.weight("norm.weight", (H,)), spec.rms_norm_eps, "final_norm")
    name = lm_head_weight(spec)
    if head is None:
        logits = g.linear(x, g.weight(f"{name}.weight", (V, H)), None, "lm_head")
    else:
        logits = g.a16_linear(x, name, V, H, head.group_for(H), head.bits, None, "lm_head")
    return g.finish([logits], ["logits"])


def lm_head_weight(spec: ModelSpec) -> str:
    """The weight lm_head multiplies by (without `.weight`): the embedding table when tied."""
    return "embed_tokens" if spec.tie_word_embeddings else "lm_head"


def head_nets(spec: ModelSpec, shapes: Shapes, head: QuantScheme | None = None) -> dict[str, ModuleOp]:
    """`head`: the lm_head's quantization (quantization.lm_head), None to keep it in the activation type."""
    return {name: head_net(spec, name, shapes.prefill_length, head)
            for name in ("embedding", "embedding_cache", "lm_head")}


def head_net(spec: ModelSpec, name: str, prefill_length: int, head: QuantScheme | None = None) -> ModuleOp:
    """One head net: `embedding` (the prefill's L rows), `embedding_cache` (one row) or `lm_head`."""
    if name == "lm_head":
        return build_lm_head(spec, head)
    return build_embedding(spec, prefill_length if name == "embedding" else 1, name, head)


def head_weight_names(spec: ModelSpec) -> list[str]:
    """The float tensors the head nets are made from (before any quantization of lm_head)."""
    names = ["embed_tokens.weight", "norm.weight"]
    if not spec.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


__all__ = ["ROPE_COS", "ROPE_SIN", "STAGES", "Shapes", "build_block", "head_nets", "block_net_name", "i32"]

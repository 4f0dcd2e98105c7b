"""Plan the global device memory of one binary (`binary/memory_map.py`'s `MemoryPlan`): every weight,
KV-cache and IO buffer at a fixed address.

It is a function of the model spec, the mode and the stage shapes only, so every per-layer job computes
the same plan independently (and the `plan` rule writes it to plan.json for people to read).

Layout, each region 4 KiB aligned (the chip's global alignment):

    [ weights: rope tables, embedding, layer 0 .. N-1, final norm, lm_head ]   stored once
    [ kv cache: layer i k, layer i v, each [S, kv_heads, head_dim] ]          persistent
      (a linear-attention layer: its state, conv [K-1, conv_dim] and recurrent [Hv, dk, dv], instead)
    [ io: input_ids, hidden ping-pong, position_ids, mask, present k/v, ... ] net inputs/outputs
    [ activations ]                                                            reused by every net
"""

from __future__ import annotations

from llmbuild.binary.memory_map import ACTIVATION_ALIGN, MemoryPlan, Slot, align
from llmbuild.dialects.plain import main_func, tensor_info
from llmbuild.families.spec import ModelSpec
from llmbuild.importer.nets import Shapes, build_block, head_nets
from llmbuild.quant.scheme import QuantScheme, activation_dtype, scheme_for


def _weight_types(spec: ModelSpec, shapes: Shapes, mode: str, scheme: QuantScheme | None,
                  head: QuantScheme | None) -> tuple[dict, dict]:
    """(kind -> (first layer of that kind, name -> (dtype, shape) of its weights)), and the head/global
    weights, after lowering. Layers of one kind have the same weights (a dense model: one kind, layer 0)."""
    from llmbuild.passes import run_passes
    from llmbuild.passes.lower_top_to_tpu import LowerTopToTpu

    def weights_of(module) -> dict:
        run_passes(module, [LowerTopToTpu(mode=mode)])
        out = {}
        for op in main_func(module).body.block.ops:
            if op.name == "top.Weight":
                info = tensor_info(op.results[0].type)
                out[op.attributes["name"].data] = (info.dtype, info.shape)
        return out

    firsts = {kind: spec.layer_types.index(kind) for kind in dict.fromkeys(spec.layer_types)} or {"full": 0}
    glob: dict = {}
    for module in head_nets(spec, shapes, head).values():
        glob.update(weights_of(module))
    templates = {}
    for kind, first in firsts.items():
        block = weights_of(build_block(spec, first, "prefill_kv", shapes, scheme))
        glob.update({k: v for k, v in block.items() if not k.startswith("layers.")})
        templates[kind] = (first, {k: v for k, v in block.items() if k.startswith("layers.")})
    return templates, glob


def make_plan(spec: ModelSpec, shapes: Shapes, mode: str, alignment: int, group_size: int = 64,
              scheme: QuantScheme | None = None, head: QuantScheme | None = None) -> MemoryPlan:
    """`scheme` (a recipe's resolved quantization) takes precedence over `mode` + `group_size`; `head`
    quantizes lm_head (and a tied embedding table)."""
    templates, glob = _weight_types(spec, shapes, mode, scheme or scheme_for(mode, group_size), head)
    act_dtype = activation_dtype(mode)
    cursor = 0
    weights: dict[str, Slot] = {}

    def place(table: dict[str, Slot], name: str, dtype: str, shape: tuple[int, ...], a: int) -> None:
        nonlocal cursor
        cursor = align(cursor, a)
        table[name] = Slot(cursor, dtype, tuple(shape))
        cursor += table[name].nbytes

    # The embedding table (float, or levels/scales/zeros when quantized) sits before the layers.
    order = ["rope.cos", "rope.sin", *sorted(n for n in glob if n.startswith("embed_tokens."))]
    for name in order:
        place(weights, name, *glob[name], alignment)
    for i in range(spec.num_layers):
        first, template = templates[spec.layer_kind(i)]
        for name, (dtype, shape) in template.items():
            place(weights, name.replace(f"layers.{first}.", f"layers.{i}.", 1), dtype, shape, alignment)
    for name in sorted(set(glob) - set(order)):
        place(weights, name, *glob[name], alignment)
    regions = {"weight": (0, align(cursor, alignment))}

    cursor = align(cursor, alignment)
    kv_base = cursor
    kv: dict[str, Slot] = {}
    kv_shape = (1, shapes.seq_length, spec.num_kv_heads, spec.head_dim)
    for i in range(spec.num_layers):
        if spec.layer_kind(i) == "linear":
            for name, shape in spec.layer_state:
                place(kv, f"layers.{i}.{name}", state_dtype(name, act_dtype), (1, *shape), alignment)
            continue
        for which in ("k", "v"):
            place(kv, f"layers.{i}.{which}", act_dtype, kv_shape, alignment)
    regions["kv"] = (kv_base, align(cursor, alignment) - kv_base)

    cursor = align(cursor, alignment)
    io_base = cursor
    io: dict[str, Slot] = {}
    L, S, H = shapes.prefill_length, shapes.seq_length, spec.hidden_size
    kvd = (spec.num_kv_heads, spec.head_dim)
    for name, dtype, shape in (
        ("input_ids", "i32", (1, L)),
        ("hidden.0", act_dtype, (1, L, H)),
        ("hidden.1", act_dtype, (1, L, H)),
        ("position_ids", "i32", (1, L)),
        ("attention_mask", act_dtype, (1, 1, L, S + L)),
        ("present_k", act_dtype, (1, L, *kvd)),
        ("present_v", act_dtype, (1, L, *kvd)),
        ("lm_in", act_dtype, (1, H)),
        ("logits", "f32", (1, spec.vocab_size)),
        *_state_io(spec, L, act_dtype),
    ):
        place(io, name, dtype, shape, ACTIVATION_ALIGN)
    regions["io"] = (io_base, align(cursor, alignment) - io_base)
    activation_base = align(cursor, alignment)
    return MemoryPlan(alignment, weights, kv, io, regions, activation_base)


def _state_io(spec: ModelSpec, L: int, act_dtype: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """A linear-attention layer's IO besides the dense block's: the prefill's token mask and the new state
    rows its stages give (families/qwen3_5/mixers.py); none for a model without such layers."""
    if "linear" not in spec.layer_types:
        return []
    state = dict(spec.layer_state)
    return [("token_mask", act_dtype, (1, L, 1)), ("present_conv", act_dtype, (1, L, state["conv"][1])),
            ("present_recurrent", state_dtype("recurrent", act_dtype), (1, *state["recurrent"]))]


def state_dtype(name: str, act_dtype: str) -> str:
    """A linear-attention state's element type: the recurrent matrix f32 (lower-top-to-tpu keeps it so), the
    convolution's window the activations' (its rows are the qkv projection's, as stored)."""
    return "f32" if name == "recurrent" else act_dtype

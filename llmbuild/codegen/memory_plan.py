"""Plan the global device memory of one binary (`binary/memory_map.py`'s `MemoryPlan`): every weight,
KV-cache and IO buffer at a fixed address.

It is a function of the model spec, the mode and the stage shapes only, so every per-layer job computes
the same plan independently (and the `plan` rule writes it to plan.json for people to read).

Layout, each region 4 KiB aligned (the chip's global alignment):

    [ weights: rope tables, embedding, layer 0 .. N-1, final norm, lm_head ]   stored once
    [ kv cache: layer i k, layer i v, each [S, kv_heads, head_dim] ]          persistent
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
    """(name -> (dtype, shape)) for layer 0's weights and the head/global weights, after lowering."""
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

    layer0 = weights_of(build_block(spec, 0, "prefill_kv", shapes, scheme))
    glob: dict = {}
    for module in head_nets(spec, shapes, head).values():
        glob.update(weights_of(module))
    glob.update({k: v for k, v in layer0.items() if not k.startswith("layers.")})
    layer0 = {k: v for k, v in layer0.items() if k.startswith("layers.")}
    return layer0, glob


def make_plan(spec: ModelSpec, shapes: Shapes, mode: str, alignment: int, group_size: int = 64,
              scheme: QuantScheme | None = None, head: QuantScheme | None = None) -> MemoryPlan:
    """`scheme` (a recipe's resolved quantization) takes precedence over `mode` + `group_size`; `head`
    quantizes lm_head (and a tied embedding table)."""
    layer0, glob = _weight_types(spec, shapes, mode, scheme or scheme_for(mode, group_size), head)
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
        for name, (dtype, shape) in layer0.items():
            place(weights, name.replace("layers.0.", f"layers.{i}.", 1), dtype, shape, alignment)
    for name in sorted(set(glob) - set(order)):
        place(weights, name, *glob[name], alignment)
    regions = {"weight": (0, align(cursor, alignment))}

    cursor = align(cursor, alignment)
    kv_base = cursor
    kv: dict[str, Slot] = {}
    kv_shape = (1, shapes.seq_length, spec.num_kv_heads, spec.head_dim)
    for i in range(spec.num_layers):
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
    ):
        place(io, name, dtype, shape, ACTIVATION_ALIGN)
    regions["io"] = (io_base, align(cursor, alignment) - io_base)
    activation_base = align(cursor, alignment)
    return MemoryPlan(alignment, weights, kv, io, regions, activation_base)

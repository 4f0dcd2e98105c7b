"""The device memory of the `vit` net: its own address space, apart from the language model's plan.

The vision tower runs once per image, before the prefill that reads its output; nothing of it lives on
while the language model runs. So it gets its own plan (weights, its inputs and output, activations), as
a net with its own coefficient memory in the incumbent's bmodel, and the language model's plan, which every
layer job computes independently from the spec, does not move when a recipe gains or changes a tower.
The runtime copies the net's `image_features` into the embedding rows of the image tokens.

Layout, each region aligned: [ weights ] [ io: pixel_values, attention_mask, image_features ] [ activations ].
"""

from __future__ import annotations

from xdsl.dialects.builtin import ModuleOp

from llmbuild.binary.memory_map import ACTIVATION_ALIGN, MemoryPlan, Slot, align
from llmbuild.dialects.plain import main_func, string_list, tensor_info


def make_vision_plan(top: ModuleOp, mode: str, alignment: int) -> MemoryPlan:
    """The plan of a `vit` TopOp net after lowering to `mode` (weights and io in their device types)."""
    from llmbuild.passes import run_passes
    from llmbuild.passes.lower_top_to_tpu import LowerTopToTpu

    lowered = top.clone()
    run_passes(lowered, [LowerTopToTpu(mode=mode)])
    fn = main_func(lowered)
    cursor = 0
    weights: dict[str, Slot] = {}
    for op in fn.body.block.ops:
        if op.name == "top.Weight":
            info = tensor_info(op.results[0].type)
            cursor = align(cursor, alignment)
            weights[op.attributes["name"].data] = Slot(cursor, info.dtype, info.shape)
            cursor += weights[op.attributes["name"].data].nbytes
    regions = {"weight": (0, align(cursor, alignment))}
    cursor = io_base = align(cursor, alignment)
    io: dict[str, Slot] = {}
    ret = fn.body.block.last_op
    values = [*zip(string_list(fn.attributes["arg_names"]), fn.body.block.args, strict=True),
              *zip(string_list(fn.attributes["result_names"]), ret.operands, strict=True)]
    for name, value in values:
        info = tensor_info(value.type)
        cursor = align(cursor, ACTIVATION_ALIGN)
        io[name] = Slot(cursor, info.dtype, info.shape)
        cursor += io[name].nbytes
    regions["io"] = (io_base, align(cursor, alignment) - io_base)
    return MemoryPlan(alignment, weights, {}, io, regions, align(cursor, alignment))

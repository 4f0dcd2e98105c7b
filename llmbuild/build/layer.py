"""`llmbuild layer RECIPE --layer I`: import, lower and generate one transformer layer's three stages.

Reads only this layer's tensors from the checkpoint (a 7B build never holds the model), writes the
TopOp and TpuOp modules of `block_i`, `block_kv_i` and `block_cache_i`, the layer's weights once
(safetensors, as imported), an object file with the three programs and the device-format weights, and
metrics.json comparing every stage against the reference.
"""

from __future__ import annotations

import numpy as np
from safetensors.numpy import save_file

from llmbuild.build.compile_net import compile_net
from llmbuild.build.layer_weights import layer_weights
from llmbuild.build.paths import BuildPaths, read_spec, shapes_of, write_json
from llmbuild.build.weights_blob import chunk_section_name, weight_chunk
from llmbuild.codegen.container import write_container
from llmbuild.codegen.program import encode
from llmbuild.importer.nets import ROPE_COS, ROPE_SIN, STAGES, build_block
from llmbuild.importer.rope import rope_tables
from llmbuild.passes.memory_plan import MemoryPlan
from llmbuild.quant.scheme import recipe_scheme
from llmbuild.recipe.schema import Recipe
from llmbuild.verify.layer_check import check_net


def build_layer(recipe: Recipe, layer: int) -> None:
    paths = BuildPaths.of(recipe)
    spec = read_spec(paths.spec)
    shapes = shapes_of(recipe)
    plan = MemoryPlan.read(paths.plan)
    out = paths.layer_dir(layer)
    out.mkdir(parents=True, exist_ok=True)

    scheme = recipe_scheme(recipe.quantization)
    weights, device_weights = layer_weights(recipe, paths, spec, layer)
    tmp = out / "weights.safetensors.tmp"
    # As imported (and quantized): levels stay uint8, act-order permutations int32, the rest float32.
    save_file({k: np.ascontiguousarray(v, dtype=_saved_dtype(k)) for k, v in weights.items()}, str(tmp))
    tmp.replace(out / "weights.safetensors")
    cos, sin = rope_tables(spec, shapes.seq_length)
    rope = {ROPE_COS: cos, ROPE_SIN: sin}

    compiled = [
        compile_net(build_block(spec, layer, stage, shapes, scheme), plan, recipe.quantization.mode,
                    recipe.target.chip, out)
        for stage in STAGES
    ]
    base, blob = weight_chunk(plan, device_weights)
    sections = [(f"net:{c.name}", [encode(c.program)]) for c in compiled]
    sections.append((chunk_section_name(base), [blob]))
    write_container(paths.layer_object(layer), sections)

    metrics = {"layer": layer, "stages": {}}
    if paths.reference.is_file():
        from llmbuild.verify.reference import load_reference

        ref = load_reference(paths.reference, (f"layers.{layer}.",))
        lookup = {**weights, **rope}
        for stage, c in zip(STAGES, compiled, strict=True):
            metrics["stages"][stage] = check_net(c, stage, layer, ref, lookup, plan, shapes,
                                                 device_weights={**device_weights, **rope})
    write_json(paths.layer_metrics(layer), metrics)


def _saved_dtype(name: str) -> type:
    if name.endswith(".qweight"):
        return np.uint8
    return np.int32 if name.endswith(".perm") else np.float32

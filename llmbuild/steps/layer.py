"""`llmbuild layer RECIPE --layer I`: import, lower and generate one transformer layer's three stages.

Reads only this layer's tensors from the checkpoint (a 7B build never holds the model), writes the
TopOp and TpuOp modules of `block_i`, `block_kv_i` and `block_cache_i`, the layer's weights in the
device's format (weights.safetensors, which link copies into the binary) and an object file with the three
programs. It does not wait for the reference: the checks are their own step (`llmbuild check`,
verify/checks.py), so compiling overlaps the reference and link can run before it finishes.
"""

from __future__ import annotations

from llmbuild.artifacts.layer_weights import layer_weights, rounds_in_build, write_rounded_scales
from llmbuild.artifacts.paths import BuildPaths, read_spec, shapes_of
from llmbuild.artifacts.weight_file import write_weight_file
from llmbuild.binary.container import write_container
from llmbuild.binary.memory_map import MemoryPlan
from llmbuild.binary.program import encode
from llmbuild.importer.nets import STAGES, build_block
from llmbuild.progress_log import StepProgress
from llmbuild.quant.scheme import recipe_scheme
from llmbuild.recipe_types import Recipe
from llmbuild.steps.compile_net import compile_net


def build_layer(recipe: Recipe, layer: int) -> None:
    paths = BuildPaths.of(recipe)
    spec = read_spec(paths.spec)
    shapes = shapes_of(recipe)
    plan = MemoryPlan.read(paths.plan)
    out = paths.layer_dir(layer)
    out.mkdir(parents=True, exist_ok=True)

    scheme = recipe_scheme(recipe.quantization)
    # A 7B layer is a job of its own and takes minutes: a line a stage in the job's log.
    progress = StepProgress(f"layer {layer} of {spec.num_layers}", total=len(STAGES))
    top_weights, device_weights = layer_weights(recipe, paths, spec, layer)
    compiled = []
    for stage in STAGES:
        compiled.append(compile_net(build_block(spec, layer, stage, shapes, scheme), paths.plan,
                                    recipe.quantization.mode, recipe.target.chip, out))
        progress.done(f"{stage} compiled")
    write_weight_file(paths.layer_weights(layer), plan, device_weights)
    if rounds_in_build(recipe):
        write_rounded_scales(paths.layer_rounded_scales(layer), top_weights, layer)
    write_container(paths.layer_object(layer), [(f"net:{c.name}", [encode(c.program)]) for c in compiled])

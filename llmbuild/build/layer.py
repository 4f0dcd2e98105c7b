"""`llmbuild layer RECIPE --layer I`: import, lower and generate one transformer layer's three stages.

Reads only this layer's tensors from the checkpoint (a 7B build never holds the model), writes the
TopOp and TpuOp modules of `block_i`, `block_kv_i` and `block_cache_i`, the layer's weights in the
device's format (weights.safetensors, which link copies into the binary), an object file with the three
programs, and metrics.json comparing every stage against the reference.
"""

from __future__ import annotations

from llmbuild.build.compile_net import compile_net
from llmbuild.build.layer_weights import layer_weights
from llmbuild.build.paths import BuildPaths, read_spec, shapes_of, write_json
from llmbuild.build.weight_file import open_weight_files, write_weight_file
from llmbuild.codegen.container import write_container
from llmbuild.codegen.program import encode
from llmbuild.importer.nets import ROPE_COS, ROPE_SIN, STAGES, build_block
from llmbuild.importer.rope import rope_tables
from llmbuild.passes.memory_plan import MemoryPlan
from llmbuild.quant.scheme import recipe_scheme
from llmbuild.recipe.schema import Recipe
from llmbuild.verify.layer_check import CheckExecutor, check_case, faithful_layers


def build_layer(recipe: Recipe, layer: int) -> None:
    paths = BuildPaths.of(recipe)
    spec = read_spec(paths.spec)
    shapes = shapes_of(recipe)
    plan = MemoryPlan.read(paths.plan)
    out = paths.layer_dir(layer)
    out.mkdir(parents=True, exist_ok=True)

    scheme = recipe_scheme(recipe.quantization)
    weights, device_weights = layer_weights(recipe, paths, spec, layer)
    compiled = [
        compile_net(build_block(spec, layer, stage, shapes, scheme), plan, recipe.quantization.mode,
                    recipe.target.chip, out)
        for stage in STAGES
    ]
    write_weight_file(paths.layer_weights(layer), plan, device_weights)
    del device_weights  # the checks read the file back, memory-mapped
    write_container(paths.layer_object(layer), [(f"net:{c.name}", [encode(c.program)]) for c in compiled])

    metrics: dict = {"layer": layer, "stages": {}}
    if paths.reference.is_file():
        from llmbuild.verify.reference import load_reference
        from llmbuild.verify.stage_cases import stage_case

        ref = load_reference(paths.reference, (f"layers.{layer}.",))
        cos, sin = rope_tables(spec, shapes.seq_length)
        rope = {ROPE_COS: cos, ROPE_SIN: sin}
        for array in weights.values():
            array.flags.writeable = False  # each projection is dequantized once for the three stages
        image = open_weight_files([paths.layer_weights(layer)], plan, rope)
        activation = max(c.program.activation_bytes for c in compiled)
        executor = CheckExecutor(plan, image, activation, layer in faithful_layers(spec.num_layers))
        lookup = {**weights, **rope}
        for stage, c in zip(STAGES, compiled, strict=True):
            case = stage_case(stage, ref, layer, shapes, recipe.verify.check_tokens)
            metrics["stages"][stage] = check_case(c, case, lookup, executor)
    write_json(paths.layer_metrics(layer), metrics)


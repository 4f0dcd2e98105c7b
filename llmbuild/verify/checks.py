"""`llmbuild check RECIPE --layer I [I ...] | --head`: the per-net checks of compiled objects against the
reference, a step of their own.

Compiling does not need the reference, so the layer and head jobs do not wait for it, and link can run
before it finishes; the checks do. A check job rebuilds what it compares from what the compile step left
and from the checkpoint: the TopOp nets (importing a layer and canonicalizing it is milliseconds), the
layer's TopOp weights (read, or as the layer job rounded them), the programs from the object file and the
device-format weights from the weight file, which both link and the checks read before Snakemake deletes
it. Memory is one layer's, as in the compile step (layer_check.py runs the nets).
"""

from __future__ import annotations

import numpy as np

from llmbuild.artifacts.head_weights import head_weights
from llmbuild.artifacts.layer_weights import checked_layer_weights
from llmbuild.artifacts.paths import BuildPaths, read_spec, shapes_of, write_json
from llmbuild.artifacts.weight_file import open_weight_files
from llmbuild.binary.container import Container
from llmbuild.binary.memory_map import MemoryPlan
from llmbuild.binary.program import Program, decode
from llmbuild.importer.nets import ROPE_COS, ROPE_SIN, STAGES, block_net_name, build_block, head_nets
from llmbuild.importer.rope import rope_tables
from llmbuild.numerics.dequantize import clear_dequantize_cache
from llmbuild.passes import run_passes
from llmbuild.passes.canonicalize import Canonicalize
from llmbuild.progress_log import StepProgress
from llmbuild.quant.scheme import head_scheme, recipe_scheme
from llmbuild.recipe_types import Recipe
from llmbuild.verify.layer_check import CheckExecutor, check_case, faithful_layers
from llmbuild.verify.reference import load_reference
from llmbuild.verify.stage_cases import StageCase, stage_case


def _programs(path) -> dict[str, Program]:
    with Container(path) as obj:
        return {name.removeprefix("net:"): decode(obj.section(name)) for name in obj.names() if name.startswith("net:")}


def check_layer(recipe: Recipe, layer: int) -> None:
    """metrics.json of one layer: its three stages against the reference."""
    paths = BuildPaths.of(recipe)
    spec = read_spec(paths.spec)
    shapes = shapes_of(recipe)
    plan = MemoryPlan.read(paths.plan)
    scheme = recipe_scheme(recipe.quantization)
    programs = _programs(paths.layer_object(layer))
    weights = checked_layer_weights(recipe, paths, spec, plan, layer)
    for array in weights.values():
        array.flags.writeable = False  # each projection is dequantized once for the three stages
    ref = load_reference(paths.reference, (f"layers.{layer}.",))
    cos, sin = rope_tables(spec, shapes.seq_length)
    rope = {ROPE_COS: cos, ROPE_SIN: sin}
    image = open_weight_files([paths.layer_weights(layer)], plan, rope)
    activation = max(p.activation_bytes for p in programs.values())
    executor = CheckExecutor(plan, image, activation, layer in faithful_layers(spec.num_layers))
    lookup = {**weights, **rope}
    metrics: dict = {"layer": layer, "stages": {}}
    # A check on the simulated device takes minutes on a big layer: a line a stage in the job's log.
    progress = StepProgress(f"check layer {layer} of {spec.num_layers}", total=len(STAGES))
    for stage in STAGES:
        top = run_passes(build_block(spec, layer, stage, shapes, scheme), [Canonicalize()])
        case = stage_case(stage, ref, layer, shapes, recipe.verify.check_tokens)
        metrics["stages"][stage] = check_case(top, programs[block_net_name(layer, stage)], case, lookup, executor)
        progress.done(f"{stage} checked")
    # The next layer of this job needs none of this one's weights, but it can reuse their memory.
    executor.release()
    clear_dequantize_cache()
    write_json(paths.layer_metrics(layer), metrics)


def check_head(recipe: Recipe) -> None:
    """head/metrics.json: the embedding, embedding_cache and lm_head nets against the reference, always on
    the simulated device (every layer's run goes through them)."""
    paths = BuildPaths.of(recipe)
    spec = read_spec(paths.spec)
    shapes = shapes_of(recipe)
    plan = MemoryPlan.read(paths.plan)
    programs = _programs(paths.head_object)
    weights, _ = head_weights(recipe, paths, spec, shapes)
    last = spec.num_layers - 1
    ref = load_reference(paths.reference, ("ids", "logits", "layers.0.input", f"layers.{last}.output"))
    ids, L = ref["ids"], shapes.prefill_length
    x0 = ref["layers.0.input"]
    rows = min(L, len(ids))
    padded = np.zeros((1, L), dtype=np.int32)
    padded[0, :rows] = ids[:rows]
    cases = {
        "embedding": StageCase({"input_ids": padded}, {"hidden_states": x0[:rows]}, rows, L),
        "embedding_cache": StageCase({"input_ids": ids[None, -1:].astype(np.int32)}, {"hidden_states": x0[-1:]}, 1),
        "lm_head": StageCase({"hidden_states": ref[f"layers.{last}.output"][-1:]}, {"logits": ref["logits"]}, 1),
    }
    image = open_weight_files([paths.head_weights], plan)
    executor = CheckExecutor(plan, image, max(p.activation_bytes for p in programs.values()), faithful=True)
    nets = head_nets(spec, shapes, head_scheme(recipe.quantization))
    metrics: dict = {"layer": "head", "stages": {}}
    progress = StepProgress("check head", total=len(cases))  # lm_head over a big vocabulary is the long one
    for name, case in cases.items():
        top = run_passes(nets[name], [Canonicalize()])
        metrics["stages"][name] = check_case(top, programs[name], case, weights, executor)
        progress.done(f"{name} checked")
    write_json(paths.head_metrics, metrics)

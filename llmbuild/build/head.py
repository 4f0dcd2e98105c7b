"""`llmbuild head RECIPE`: the nets around the layers (`embedding`, `embedding_cache`, `lm_head`) and
the global weights (RoPE tables, embedding, final norm, lm_head), compiled and checked like a layer."""

from __future__ import annotations

import numpy as np
from safetensors.numpy import save_file

from llmbuild.build.compile_net import compile_net
from llmbuild.build.layer_weights import tensor_source
from llmbuild.build.paths import BuildPaths, read_spec, shapes_of, write_json
from llmbuild.build.quantize_layer import quantize_head
from llmbuild.build.weights_blob import chunk_section_name, weight_chunk
from llmbuild.codegen.container import write_container
from llmbuild.codegen.program import encode
from llmbuild.importer.nets import ROPE_COS, ROPE_SIN, head_nets, head_weight_names, lm_head_weight
from llmbuild.importer.rope import rope_tables
from llmbuild.passes.memory_plan import MemoryPlan
from llmbuild.quant.scheme import head_scheme
from llmbuild.recipe.schema import Recipe
from llmbuild.verify.layer_check import check_case
from llmbuild.verify.stage_cases import StageCase


def build_head(recipe: Recipe) -> None:
    paths = BuildPaths.of(recipe)
    spec = read_spec(paths.spec)
    shapes = shapes_of(recipe)
    plan = MemoryPlan.read(paths.plan)
    out = paths.head_dir
    out.mkdir(parents=True, exist_ok=True)

    source = tensor_source(recipe, paths)
    weights = {name: source.tensor(name) for name in head_weight_names(spec)}
    cos, sin = rope_tables(spec, shapes.seq_length)
    weights[ROPE_COS], weights[ROPE_SIN] = cos, sin
    head = head_scheme(recipe.quantization)
    device_weights = weights
    if head is not None:
        weights, device_weights = quantize_head(weights, lm_head_weight(spec), head)
    tmp = out / "weights.safetensors.tmp"
    save_file({k: np.ascontiguousarray(v, dtype=np.uint8 if k.endswith(".qweight") else np.float32)
               for k, v in sorted(weights.items())}, str(tmp))
    tmp.replace(out / "weights.safetensors")

    compiled = {
        name: compile_net(module, plan, recipe.quantization.mode, recipe.target.chip, out)
        for name, module in head_nets(spec, shapes, head).items()
    }
    sections = [(f"net:{name}", [encode(c.program)]) for name, c in compiled.items()]
    # Two chunks: the tables and embedding sit before the layers, the final norm and lm_head after.
    early = {k: v for k, v in device_weights.items() if k in (ROPE_COS, ROPE_SIN) or k.startswith("embed_tokens.")}
    late = {k: v for k, v in device_weights.items() if k not in early}
    for part in (early, late):
        base, blob = weight_chunk(plan, part)
        sections.append((chunk_section_name(base), [blob]))
    write_container(paths.head_object, sections)

    metrics: dict = {"layer": "head", "stages": {}}
    if paths.reference.is_file():
        from llmbuild.verify.reference import load_reference

        last = spec.num_layers - 1
        ref = load_reference(paths.reference, ("ids", "logits", "layers.0.input", f"layers.{last}.output"))
        ids, L = ref["ids"], shapes.prefill_length
        x0 = ref["layers.0.input"]
        cases = {
            "embedding": StageCase(
                {"input_ids": ids[None, :L].astype(np.int32)}, {"hidden_states": x0[:L]}, L
            ),
            "embedding_cache": StageCase(
                {"input_ids": ids[None, -1:].astype(np.int32)}, {"hidden_states": x0[-1:]}, 1
            ),
            "lm_head": StageCase(
                {"hidden_states": ref[f"layers.{last}.output"][-1:]}, {"logits": ref["logits"]}, 1
            ),
        }
        for name, case in cases.items():
            metrics["stages"][name] = check_case(compiled[name], case, weights, plan, device_weights)
    write_json(paths.head_metrics, metrics)

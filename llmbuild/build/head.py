"""`llmbuild head RECIPE`: the nets around the layers (`embedding`, `embedding_cache`, `lm_head`) and
the global weights (RoPE tables, embedding, final norm, lm_head), compiled and checked like a layer.

A real-size vocabulary table (Qwen2-7B: 152064 x 3584, 2.2 GB in float32, twice when lm_head is not tied)
is never held whole: it is read, converted and written in row blocks, and the checks read it by rows
from the memory-mapped weight file (the embedding looks up a few rows, lm_head streams slices of rows).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.build.compile_net import compile_net
from llmbuild.build.layer_weights import tensor_source
from llmbuild.build.paths import BuildPaths, read_spec, shapes_of, write_json
from llmbuild.build.quantize_layer import quantize_head
from llmbuild.build.weight_file import open_weight_files, write_weight_file
from llmbuild.codegen.container import write_container
from llmbuild.codegen.program import encode
from llmbuild.frontend.spec import TensorSource
from llmbuild.importer.nets import ROPE_COS, ROPE_SIN, head_nets, head_weight_names, lm_head_weight
from llmbuild.importer.rope import rope_tables
from llmbuild.numerics.stored import RowReader, materialize
from llmbuild.passes.memory_plan import MemoryPlan
from llmbuild.quant.scheme import head_scheme
from llmbuild.recipe.schema import Recipe
from llmbuild.verify.layer_check import CheckExecutor, check_case
from llmbuild.verify.stage_cases import StageCase

# Tensors larger than this in float32 are read by rows when the source can (HF safetensors).
STREAMED_BYTES = 256 << 20


def build_head(recipe: Recipe) -> None:
    paths = BuildPaths.of(recipe)
    spec = read_spec(paths.spec)
    shapes = shapes_of(recipe)
    plan = MemoryPlan.read(paths.plan)
    out = paths.head_dir
    out.mkdir(parents=True, exist_ok=True)

    source = tensor_source(recipe, paths)
    weights: dict[str, Any] = {name: _head_tensor(source, name) for name in head_weight_names(spec)}
    cos, sin = rope_tables(spec, shapes.seq_length)
    weights[ROPE_COS], weights[ROPE_SIN] = cos, sin
    head = head_scheme(recipe.quantization)
    device_weights = weights
    if head is not None:
        # Round to nearest over the whole table: a quantized lm_head is a small model's option (docs/design.md).
        weights, device_weights = quantize_head({k: materialize(v) for k, v in weights.items()},
                                                lm_head_weight(spec), head)
    write_weight_file(paths.head_weights, plan,
                      {k: v.rows if isinstance(v, RowReader) else v for k, v in device_weights.items()})
    del device_weights
    compiled = {
        name: compile_net(module, plan, recipe.quantization.mode, recipe.target.chip, out)
        for name, module in head_nets(spec, shapes, head).items()
    }
    write_container(paths.head_object, [(f"net:{name}", [encode(c.program)]) for name, c in compiled.items()])

    metrics: dict = {"layer": "head", "stages": {}}
    if paths.reference.is_file():
        from llmbuild.verify.reference import load_reference

        last = spec.num_layers - 1
        ref = load_reference(paths.reference, ("ids", "logits", "layers.0.input", f"layers.{last}.output"))
        ids, L = ref["ids"], shapes.prefill_length
        x0 = ref["layers.0.input"]
        rows = min(L, len(ids))
        padded = np.zeros((1, L), dtype=np.int32)
        padded[0, :rows] = ids[:rows]
        cases = {
            "embedding": StageCase({"input_ids": padded}, {"hidden_states": x0[:rows]}, rows, L),
            "embedding_cache": StageCase(
                {"input_ids": ids[None, -1:].astype(np.int32)}, {"hidden_states": x0[-1:]}, 1
            ),
            "lm_head": StageCase(
                {"hidden_states": ref[f"layers.{last}.output"][-1:]}, {"logits": ref["logits"]}, 1
            ),
        }
        # The head's nets are shared by every layer's run: always checked on the simulated device.
        image = open_weight_files([paths.head_weights], plan)
        activation = max(c.program.activation_bytes for c in compiled.values())
        executor = CheckExecutor(plan, image, activation, faithful=True)
        for name, case in cases.items():
            metrics["stages"][name] = check_case(compiled[name], case, weights, executor)
    write_json(paths.head_metrics, metrics)


def _head_tensor(source: TensorSource, name: str) -> np.ndarray | RowReader:
    reader = getattr(source, "reader", None)
    if reader is not None and name in source.names():
        lazy = reader(name)
        if 4 * int(np.prod(lazy.shape)) > STREAMED_BYTES:
            return lazy
    return source.tensor(name)

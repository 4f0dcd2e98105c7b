"""`llmbuild head RECIPE`: the nets around the layers (`embedding`, `embedding_cache`, `lm_head`) and
the global weights (RoPE tables, embedding, final norm, lm_head), compiled like a layer (and checked like
one by `llmbuild check --head`).

A real-size vocabulary table (Qwen2-7B: 152064 x 3584, 2.2 GB in float32, twice when lm_head is not tied)
is never held whole: it is read, converted and written in row blocks, and the checks read it by rows
from the memory-mapped weight file (the embedding looks up a few rows, lm_head streams slices of rows).
"""

from __future__ import annotations

from llmbuild.artifacts.head_weights import head_weights
from llmbuild.artifacts.paths import BuildPaths, read_spec, shapes_of
from llmbuild.artifacts.weight_file import write_weight_file
from llmbuild.binary.container import write_container
from llmbuild.binary.memory_map import MemoryPlan
from llmbuild.binary.program import encode
from llmbuild.importer.nets import head_nets
from llmbuild.quant.scheme import head_scheme
from llmbuild.recipe_types import Recipe
from llmbuild.steps.compile_net import compile_net


def build_head(recipe: Recipe) -> None:
    paths = BuildPaths.of(recipe)
    spec = read_spec(paths.spec)
    shapes = shapes_of(recipe)
    plan = MemoryPlan.read(paths.plan)
    out = paths.head_dir
    out.mkdir(parents=True, exist_ok=True)

    _, device_weights = head_weights(recipe, paths, spec, shapes)
    head = head_scheme(recipe.quantization)
    write_weight_file(paths.head_weights, plan, device_weights)  # tables by rows, bf16 ones without decoding
    compiled = {
        name: compile_net(module, paths.plan, recipe.quantization.mode, recipe.target.chip, out)
        for name, module in head_nets(spec, shapes, head).items()
    }
    write_container(paths.head_object, [(f"net:{name}", [encode(c.program)]) for name, c in compiled.items()])

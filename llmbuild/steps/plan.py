"""`llmbuild plan RECIPE`: the global device-memory plan (plan.json), after checking the chip can hold
the model at all."""

from __future__ import annotations

from llmbuild.artifacts.paths import BuildPaths, read_spec, shapes_of, write_text_atomic
from llmbuild.chips import load_chip
from llmbuild.codegen.memory_plan import make_plan
from llmbuild.quant.scheme import head_scheme, recipe_scheme
from llmbuild.recipe_types import Recipe


def plan(recipe: Recipe) -> None:
    paths = BuildPaths.of(recipe)
    spec = read_spec(paths.spec)
    # Fail at build start, with the numbers, when the chip cannot hold the model (not at link time).
    from llmbuild.cost import check_fits

    check_fits(recipe, spec)
    chip = load_chip(recipe.target.chip)
    memory = make_plan(spec, shapes_of(recipe), recipe.quantization.mode, chip.global_alignment,
                       scheme=recipe_scheme(recipe.quantization), head=head_scheme(recipe.quantization))
    write_text_atomic(paths.plan, memory.to_json() + "\n")

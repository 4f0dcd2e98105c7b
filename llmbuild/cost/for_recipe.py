"""The cost model applied to a recipe: its spec from configuration only (no weights), its estimate, and
the device-memory check a build runs before any work (`check_fits`)."""

from __future__ import annotations

from llmbuild import LlmbuildError
from llmbuild.chips import load_chip
from llmbuild.cost.chip_estimate import Estimate, estimate
from llmbuild.cost.memory import MemoryEstimate, estimate_memory
from llmbuild.cost.ops import lm_head_format
from llmbuild.cost.schedule import DEFAULT_SCHEDULE, Schedule
from llmbuild.cost.weight_formats import weight_format
from llmbuild.families.spec import ModelSpec
from llmbuild.frontend.config_spec import spec_without_weights
from llmbuild.recipe_types import Recipe


def estimate_recipe(recipe: Recipe, spec: ModelSpec | None = None, position: int | None = None,
                    schedule: Schedule | str = DEFAULT_SCHEDULE) -> Estimate:
    spec = spec or spec_without_weights(recipe.source)
    q, stages = recipe.quantization, recipe.stages
    return estimate(spec, q.mode, q.group_size, recipe.target.chip, stages.seq_length, stages.prefill_length,
                    position, schedule=schedule, device_memory_bytes=recipe.target.device_memory_bytes,
                    lm_head=q.lm_head)


def recipe_memory(recipe: Recipe, spec: ModelSpec | None = None) -> MemoryEstimate:
    """Device memory of the binary llmbuild builds for `recipe` (the `llmbuild` schedule's layout)."""
    spec = spec or spec_without_weights(recipe.source)
    chip = load_chip(recipe.target.chip)
    limit = recipe.target.device_memory_bytes or chip.device_memory_bytes
    q = recipe.quantization
    fmt = weight_format(q.mode, q.group_size)
    return estimate_memory(spec, fmt, recipe.stages.seq_length, recipe.stages.prefill_length,
                           chip.global_alignment, limit, lm_head_format(spec, fmt, q.lm_head, False))


FIT_ADVICE = "use a smaller quantization.mode, shorter stages, or set target.device_memory_bytes"


def limit_source(recipe: Recipe) -> str:
    """Where the device-memory limit comes from, for messages."""
    return "target.device_memory_bytes" if recipe.target.device_memory_bytes else "the board default"


def check_fits(recipe: Recipe, spec: ModelSpec | None = None) -> MemoryEstimate:
    """Fail in one line, with the numbers, when the recipe's model cannot fit its chip's device memory.

    Cheap (milliseconds, any model size): `plan` calls it first, before compiling anything (the recipe
    loader refuses such a model at its line already, where it knows the model's configuration).
    """
    memory = recipe_memory(recipe, spec)
    if not memory.fits:
        raise LlmbuildError(
            f"{recipe.path}: target.chip: {recipe.target.chip} has {memory.limit_bytes / 2**30:.2f} GiB of device "
            f"memory ({limit_source(recipe)}), the model needs {memory.breakdown()}: {FIT_ADVICE}"
        )
    return memory

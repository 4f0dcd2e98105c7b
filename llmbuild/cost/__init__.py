"""The cost model: time and device memory of a model on a chip, from its spec alone (no weights, no IR).

    estimate(spec, mode, group_size, chip, seq_length, prefill_length, position=None) -> Estimate
    estimate_from_meta(meta) -> Estimate          a built binary's meta JSON
    estimate_recipe(recipe) -> Estimate           `llmbuild estimate RECIPE`
    check_fits(recipe)                            a one-line error when the model cannot fit the chip
    time_compiled(meta, programs), perf_report    a built binary's layer groups timed (perf.json)

One file per job: hardware (chip rates), formats (bytes per weight), ops (per-stage work), schedule
(overlap of DMA and compute), efficiency (fitted constants), calibration (the fit), memory (device memory
as the build lays it out), model (estimate), for_recipe, report, cli_estimate; groups (the compiled
groups' commands timed) and compiled (per step, and perf.json). See docs/design.md, "The cost model".

Names are imported on first use, so `llmbuild.cli_estimate` can join the CLI's parser without
making every `llmbuild` command import numpy.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Efficiency": "llmbuild.cost.efficiency",
    "check_fits": "llmbuild.cost.for_recipe",
    "perf_report": "llmbuild.cost.compiled",
    "read_binary": "llmbuild.cost.compiled",
    "time_compiled": "llmbuild.cost.compiled",
    "time_programs": "llmbuild.cost.group_timing",
    "estimate_recipe": "llmbuild.cost.for_recipe",
    "recipe_memory": "llmbuild.cost.for_recipe",
    "MemoryEstimate": "llmbuild.cost.memory",
    "Estimate": "llmbuild.cost.chip_estimate",
    "StageCost": "llmbuild.cost.chip_estimate",
    "estimate": "llmbuild.cost.chip_estimate",
    "estimate_from_meta": "llmbuild.cost.chip_estimate",
    "DEFAULT_SCHEDULE": "llmbuild.cost.schedule",
    "INCUMBENT": "llmbuild.cost.schedule",
    "LLMBUILD": "llmbuild.cost.schedule",
    "SCHEDULES": "llmbuild.cost.schedule",
    "Schedule": "llmbuild.cost.schedule",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'llmbuild.cost' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)

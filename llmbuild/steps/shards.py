"""Which layers build in one job.

A job's first layer costs about a second more than the next (Python, numpy and xDSL start, caches
warm), which is several SmolLM2-135M layers (3.5M weights, all three stages compiled and checked in
about 0.2 s) or half a 1.5B layer. So layers are built a few to a job, sized so that a job holds about
SHARD_WEIGHTS weights, and two jobs at least (SmolLM2: 15 layers a job; the 1.5B: four); from 200M
weights a layer (a 7B model) up, every layer is its own job, so layers build in parallel and a killed
build resumes layer by layer. A job holds one layer at a time. Shards depend only on the model's shapes:
the same recipe always gives the same jobs, whatever the machine.
"""

from __future__ import annotations

import math
from dataclasses import replace

from llmbuild.families.layout import expected_shapes
from llmbuild.families.spec import ModelSpec

SHARD_WEIGHTS = 200_000_000
MIN_JOBS = 2  # two cores at least: a small model's layers still build on both


def layer_weights(spec: ModelSpec) -> int:
    one = expected_shapes(replace(spec, num_layers=1))
    return sum(math.prod(s) for name, s in one.items() if name.startswith("layers."))


def shard_layers(spec: ModelSpec) -> list[list[int]]:
    """Consecutive layers per job, the jobs as even as possible."""
    n = spec.num_layers
    per_job = max(1, min(n, SHARD_WEIGHTS // max(1, layer_weights(spec))))
    jobs = min(n, max(MIN_JOBS, math.ceil(n / per_job)))
    bounds = [round(j * n / jobs) for j in range(jobs + 1)]
    return [list(range(bounds[j], bounds[j + 1])) for j in range(jobs)]

"""Which layers build in one job.

A process start costs about 0.3 s (Python, numpy, xDSL), which is most of the work of one small layer
(SmolLM2-135M: 3.5M weights, all three stages compiled and checked in about 0.4 s). So small layers are
built a few to a job, sized so that a job holds about SHARD_WEIGHTS weights; from about 50M weights a
layer (a 1.5B model) up, every layer is its own job, so layers build in parallel, a killed build resumes
layer by layer, and a job's peak memory is one layer's. Shards depend only on the model's shapes: the
same recipe always gives the same jobs, whatever the machine.
"""

from __future__ import annotations

import math
from dataclasses import replace

from llmbuild.frontend.arch.base import expected_shapes
from llmbuild.frontend.spec import ModelSpec

SHARD_WEIGHTS = 32_000_000


def layer_weights(spec: ModelSpec) -> int:
    one = expected_shapes(replace(spec, num_layers=1))
    return sum(math.prod(s) for name, s in one.items() if name.startswith("layers."))


def shard_layers(spec: ModelSpec) -> list[list[int]]:
    """Consecutive layers per job, the jobs as even as possible."""
    n = spec.num_layers
    per_job = max(1, min(n, SHARD_WEIGHTS // max(1, layer_weights(spec))))
    jobs = math.ceil(n / per_job)
    bounds = [round(j * n / jobs) for j in range(jobs + 1)]
    return [list(range(bounds[j], bounds[j + 1])) for j in range(jobs)]

"""Which nets and parts of a bmodel the cmodel checks: a policy of its own, so that the Snakefile (and the
compile steps' code digests, which import it) size and plan those jobs without importing the simulator."""

from __future__ import annotations

import os

from llmbuild.cost.chip_estimate import param_count
from llmbuild.families.spec import ModelSpec
from llmbuild.verify.layer_check_policy import faithful_layers

# Up to this size every net is checked and the model generates end to end on the cmodel: the tiny recipes
# (under a million parameters) in seconds. SmolLM2-135M's 30 layers would take minutes there (a prefill
# block 1.5 s, 0.2 s a decode block a token), so it is checked as a real-size model is.
SMALL_MODEL_PARAMS = 2e7
# Another bound for this process and the jobs it starts (0: every model is checked as a real-size one, part by
# part: how the tests exercise that path on a tiny model in seconds).
SMALL_MODEL_ENV = "LLMBUILD_SMALL_MODEL_PARAMS"


def is_small(spec: ModelSpec) -> bool:
    return param_count(spec) <= float(os.environ.get(SMALL_MODEL_ENV, SMALL_MODEL_PARAMS))


def checked_layers(spec: ModelSpec) -> list[int]:
    """Every layer of a small model; the first, middle and last of a real-size one."""
    return list(range(spec.num_layers)) if is_small(spec) else sorted(faithful_layers(spec.num_layers))


def check_parts(spec: ModelSpec) -> list[str]:
    """The parts a real-size bmodel's checks run on before the combine: the head's embeddings, lm_head (by its
    twin without the top-1, verify/bmodel_checks.py) and each sampled layer; none for a small model (checked
    whole, end to end)."""
    return [] if is_small(spec) else ["head", "lm_head", *(f"layer_{i}" for i in checked_layers(spec))]

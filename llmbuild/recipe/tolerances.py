"""Default verification tolerances from an error budget: what rounding in the build's arithmetic can do to
each compared tensor, times a safety factor.

A recipe that sets a tolerance keeps it; an absent one comes from `default_tolerances(mode, num_layers)`.
docs/verification.md has the derivation and the measured builds beside it; in short:

- A value stored in a format with unit roundoff u (bf16 2^-8, f16 2^-11, f32 2^-24) gains a relative error
  uniform in [-u, u], of root mean square u/sqrt(3). Independent roundings add in quadrature, so a tensor
  that went through n of them on its longest path carries a relative error of about u * sqrt(n / 3).
- One decoder layer stores its activations `LAYER_ROUNDINGS` times on its longest path (below); the
  products accumulate in float32, whose order-dependent error (a few float32 ulps per reduction) is far
  below one 16-bit rounding.
- Per op (`tpu_*`: the device program against TOP, each op of one layer) the path is one layer: the budget
  is `SAFETY["op"]` times u * sqrt(13 / 3). The logits (`logits_cosine`: the binary end to end against
  transformers) went through every layer: `SAFETY["logits"]` times u * sqrt(13 L / 3) for L layers; a vision
  tower's image features through its layers alike, with `SAFETY["image"]`.
- In float32 (`top_*`: TOP against transformers, both float32; and a float32 build's `tpu_*` and logits)
  nothing is stored in a narrower format: what differs is evaluation order and the elementary functions
  (exp, rsqrt, erf) to a few ulps each, budgeted as `SAFETY["order"]` float32 roundings' worth.
- A relative error d is a Euclidean similarity of 1 - d and a cosine of about 1 - d^2/2. Similarities are
  recorded to 7 decimals, so no cosine tolerance is tighter than 1 - `COSINE_FLOOR`: below d = 1e-3 a
  cosine cannot see the error, and the Euclidean similarity of the same comparison holds it.

The safety factors were set once against the builds measured in docs/verification.md, to two conditions:
every shipped and real-size build of a real checkpoint sits inside its budget with room (at least 1.5x
on the relative error), and the same build with ten times its relative error fails.

Models under `TINY_PARAMS` parameters are the project's random-weight fixtures (no published checkpoint is
that small): their near-flat logits over a few hundred tokens carry 18-30 roundings' worth of relative error
through 1-4 layers, which no rounding budget of a real model describes, so their logits keep the measured
`TINY_LOGITS_COSINE`; their per-op and float32 comparisons keep the budget.
"""

from __future__ import annotations

import math

KINDS = ("top_cosine", "top_euclid", "tpu_cosine", "tpu_euclid", "logits_cosine")
UNIT_ROUNDOFF = {"f32": 2.0**-24, "bf16": 2.0**-8, "f16": 2.0**-11}
# Stored activations on the longest path through one decoder layer: the attention norm, the q/k/v product,
# rope, the attention's scores, probabilities and output, the o product, the residual add, the MLP norm,
# the gate/up product, SiLU, the gate x up product, the down product, the residual add.
LAYER_ROUNDINGS = 13
SAFETY = {"order": 25.0, "op": 8.0, "logits": 4.0, "image": 2.5}
COSINE_FLOOR = 5e-7  # a recorded cosine has 7 decimals: 1 - 5e-7 is the tightest it can be held to
# Depth assumed where the loader cannot read the model's (a configuration without num_hidden_layers: its
# prepare step names the missing field); the image features' tower depth (InternViT-300M: 24, SigLIP-400M:
# 27 layers).
DEFAULT_LAYERS = 32
TOWER_LAYERS = 27
TINY_PARAMS = 2e7
# Twice the worst relative error the random-weight fixtures measured (bf16: 0.9929 at llama_tiny_w4_awq's worst
# step; f16: 0.99975), as a cosine.
TINY_LOGITS_COSINE = {"bf16": 0.97, "f16": 0.999}


def activation_dtype(mode: str) -> str:
    """f32, f16 or bf16: the arithmetic a mode's activations run in (w4bf16 -> bf16)."""
    if mode == "f32":
        return "f32"
    return "bf16" if mode.endswith("bf16") else "f16"


def rounding_error(dtype: str, roundings: int) -> float:
    """Root-mean-square relative error of `roundings` independent roundings to `dtype`."""
    return UNIT_ROUNDOFF[dtype] * math.sqrt(roundings / 3.0)


def error_budget(kind: str, dtype: str, num_layers: int, state_roundings: int = 0) -> float:
    """The relative error a comparison of `kind` may show, in activation dtype `dtype` (see the module);
    `state_roundings`: float32 roundings a layer's recurrent state takes over the sequence (its family's per
    token times the sequence length), on the path beside the layer's own, added in quadrature."""
    depth = num_layers if kind.startswith(("logits", "image")) else 1
    state = rounding_error("f32", state_roundings * depth)
    if kind.startswith("top_") or dtype == "f32":
        return SAFETY["order"] * rounding_error("f32", (LAYER_ROUNDINGS + state_roundings) * depth)
    safety = SAFETY["op"] if kind.startswith("tpu_") else SAFETY["image" if kind.startswith("image") else "logits"]
    return safety * math.hypot(rounding_error(dtype, LAYER_ROUNDINGS * depth), state)


def tolerance(kind: str, budget: float) -> float:
    """The similarity a relative error of `budget` gives, its budget rounded up to two significant digits."""
    if kind.endswith("cosine"):
        budget = max(budget * budget / 2.0, COSINE_FLOOR)
    digit = 10.0 ** (math.floor(math.log10(budget)) - 1)
    return round(1.0 - math.ceil(round(budget / digit, 9)) * digit, 12)


def relative_error(kind: str, similarity: float) -> float:
    """The relative error a recorded similarity stands for (the inverse of `tolerance`'s conversion)."""
    if kind.endswith("cosine"):
        return math.sqrt(max(2.0 * (1.0 - similarity), 0.0))
    return 1.0 - similarity


def default_tolerances(mode: str, num_layers: int | None = None, params: float | None = None,
                       state_roundings: int = 0) -> dict[str, float]:
    """The budget of a model of `num_layers` layers and `params` parameters (None: a real model's depth)
    whose layers' recurrent state takes `state_roundings` float32 roundings (`error_budget`)."""
    dtype = activation_dtype(mode)
    layers = num_layers or DEFAULT_LAYERS
    out = {kind: tolerance(kind, error_budget(kind, dtype, layers, state_roundings)) for kind in KINDS}
    if params is not None and params < TINY_PARAMS and dtype in TINY_LOGITS_COSINE:
        out["logits_cosine"] = TINY_LOGITS_COSINE[dtype]
    return out


def default_image_cosine(mode: str) -> float:
    """The vit net's image features against the reference: a tower's depth of roundings, like the logits."""
    dtype = activation_dtype(mode)
    return tolerance("image_cosine", error_budget("image_cosine", dtype, TOWER_LAYERS))

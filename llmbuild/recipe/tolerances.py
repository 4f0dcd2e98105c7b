"""Default verification tolerances, one set per activation dtype, derived from measured margins.

A recipe that sets a tolerance keeps it; an absent one comes from `default_tolerances(mode)`. The numbers
below are the worst similarities the shipped builds reach (`python benchmarks/margins.py BUILD...`, every
layer, stage, op and output; docs/verification.md has the run). A default leaves room for twice the
relative error that was measured: for a relative error d, the Euclidean similarity is 1 - d and the
cosine about 1 - d^2/2, so the euclid budget is 2x the measured (1 - euclid) and the cosine budget 4x the
measured (1 - cosine), rounded up to one significant digit, and never tighter than a float32
rounding-order floor. What the weights' quantization does is not in these margins: TOP and TPU read the
same quantized weights, and transformers runs them too; only the arithmetic differs.
"""

from __future__ import annotations

import math

KINDS = ("top_cosine", "top_euclid", "tpu_cosine", "tpu_euclid", "logits_cosine")
# Worst measured similarity per activation dtype and kind (benchmarks/margins.py on the shipped builds).
# logits_cosine is the worst step of the teacher-forced end-to-end run (verify/e2e.py), not the first
# step's alone: a tiny model's steps spread widely (llama_tiny_w4_awq: 0.99294 at its worst step).
MEASURED: dict[str, dict[str, float]] = {
    "f32": {"top_cosine": 1.0, "top_euclid": 0.9999985, "tpu_cosine": 1.0, "tpu_euclid": 0.9999993,
            "logits_cosine": 1.0},
    "f16": {"top_cosine": 1.0, "top_euclid": 0.9999985, "tpu_cosine": 0.9999941, "tpu_euclid": 0.9961681,
            "logits_cosine": 0.9997535},
    "bf16": {"top_cosine": 1.0, "top_euclid": 0.9999986, "tpu_cosine": 0.9995365, "tpu_euclid": 0.9661107,
             "logits_cosine": 0.9929378},
}
# float32 sums in another order differ by about 1e-6 relative; the floors leave that 10-100x room.
FLOOR = {"cosine": 1e-5, "euclid": 1e-4}
ERROR_FACTOR = {"cosine": 4.0, "euclid": 2.0}


def activation_dtype(mode: str) -> str:
    """f32, f16 or bf16: the arithmetic a mode's activations run in (w4bf16 -> bf16)."""
    if mode == "f32":
        return "f32"
    return "bf16" if mode.endswith("bf16") else "f16"


def derive(kind: str, worst: float) -> float:
    """The tolerance the rule above gives for a measured worst similarity of `kind`."""
    measure = "cosine" if kind.endswith("cosine") else "euclid"
    budget = max(ERROR_FACTOR[measure] * (1.0 - worst), FLOOR[measure])
    digit = 10.0 ** math.floor(math.log10(budget))
    budget = math.ceil(round(budget / digit, 9)) * digit  # one significant digit, rounded up
    return round(1.0 - budget, 9)


DEFAULTS: dict[str, dict[str, float]] = {
    dtype: {kind: derive(kind, worst) for kind, worst in measured.items()} for dtype, measured in MEASURED.items()
}


def default_tolerances(mode: str) -> dict[str, float]:
    return dict(DEFAULTS[activation_dtype(mode)])


# The vit net's image features against the reference (`vision.image_cosine`), worst measured per activation
# dtype: f32 on internvl_tiny_f32 and minicpmv_tiny_f32 (1 - 2.3e-13), bf16 on internvl_tiny_bf16
# (0.9999769) and the real-size InternViT-300M of internvl3_2b_w4 (24 layers, 0.9999169, the worst). No
# vision recipe computes in f16; it takes bf16's default, which its three more mantissa bits only widen.
IMAGE_MEASURED: dict[str, float] = {"f32": 0.9999999999998, "bf16": 0.9999169, "f16": 0.9999169}
IMAGE_DEFAULTS: dict[str, float] = {dtype: derive("image_cosine", worst) for dtype, worst in IMAGE_MEASURED.items()}


def default_image_cosine(mode: str) -> float:
    return IMAGE_DEFAULTS[activation_dtype(mode)]

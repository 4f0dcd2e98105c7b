"""The binary's greedy run against the reference's: where they part, and the teacher-forced run that keeps
every step compared (used by the text and the image end-to-end checks)."""

from __future__ import annotations

import numpy as np

from llmbuild.runtime.compiled_model import CompiledModel


def first_difference(ids: list[int], expected: list[int]) -> int | None:
    """The first step where the two greedy runs part (a shorter run parts where it ends); None if equal."""
    parted = next((i for i, (a, b) in enumerate(zip(ids, expected, strict=False)) if a != b), None)
    if parted is None and len(ids) != len(expected):
        parted = min(len(ids), len(expected))
    return parted


def teacher_forced(model: CompiledModel, prompt: list[int], expected: list[int]) -> list[np.ndarray]:
    """The binary's logits at every step of the reference's greedy run, each step fed the reference's token
    rather than its own choice: every step is then compared in the same context as the reference's, and
    one near-tie resolved the other way does not leave the steps after it unchecked. Where the binary's
    own choices all equal the reference's ids, its free-running greedy ids are those ids."""
    logits = [model.prefill(prompt)]
    for token in expected[:-1]:
        logits.append(model.decode_token(token))
    return logits


def free_parting(ids: list[int], expected: list[int], logits: list[np.ndarray], ref_logits: np.ndarray) -> dict:
    """`parting` for two free-running greedy runs (an image prompt's, where nothing is teacher-forced): where
    they first part and both top-2 gaps there, the last step at which both saw the same tokens."""
    parted = first_difference(ids, expected)
    both = parted is not None and parted < min(len(logits), len(ref_logits))  # not where one run ended
    return {"first_difference": parted, "top2_gap_at_difference": _gap(logits[parted]) if both else None,
            "reference_top2_gap_at_difference": _gap(ref_logits[parted]) if both else None}


def _gap(row: np.ndarray) -> float:
    """The top-2 logit gap of one step."""
    top2 = np.sort(np.asarray(row, np.float32))[-2:]
    return round(float(top2[1] - top2[0]), 6)


def parting(ids: list[int], expected: list[int], logits: list[np.ndarray], ref_logits: np.ndarray) -> dict:
    """Where the binary's choice first differs from the reference's, and both runs' top-2 logit gaps
    there (a near-tie explains a parting; a wide gap is a bug)."""
    found = free_parting(ids, expected, logits, ref_logits)
    differing = 0 if found["first_difference"] is None else sum(a != b for a, b in zip(ids, expected, strict=True))
    return {**found, "steps_differing": differing}

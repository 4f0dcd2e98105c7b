"""Where a binary's greedy run parts from the reference's, and the top-2 gaps there (verify/greedy_runs.py)."""

from __future__ import annotations

import numpy as np

from llmbuild.verify.greedy_runs import free_parting, parting


def _logits(winners: list[int], gaps: list[float], vocab: int = 6) -> np.ndarray:
    rows = np.zeros((len(winners), vocab), np.float32)
    for step, (token, gap) in enumerate(zip(winners, gaps, strict=True)):
        rows[step, token] = 1.0 + gap
        rows[step, (token + 1) % vocab] = 1.0
    return rows


def test_two_free_runs_part_where_their_tokens_first_differ_and_both_gaps_are_there() -> None:
    ours, theirs = [1, 2, 3, 4], [1, 2, 5, 0]
    found = free_parting(ours, theirs, list(_logits(ours, [3, 3, 0.25, 3])), _logits(theirs, [3, 3, 0.5, 3]))
    assert found == {"first_difference": 2, "top2_gap_at_difference": 0.25, "reference_top2_gap_at_difference": 0.5}


def test_equal_runs_and_a_run_that_ended_first_have_no_gaps() -> None:
    ids = [1, 2, 3]
    assert free_parting(ids, ids, list(_logits(ids, [1, 1, 1])), _logits(ids, [1, 1, 1]))["first_difference"] is None
    ended = free_parting([1, 2], ids, list(_logits([1, 2], [1, 1])), _logits(ids, [1, 1, 1]))
    assert ended == {"first_difference": 2, "top2_gap_at_difference": None, "reference_top2_gap_at_difference": None}


def test_a_teacher_forced_run_counts_every_step_that_differs() -> None:
    ours, theirs = [1, 4, 3, 0], [1, 2, 3, 5]
    found = parting(ours, theirs, list(_logits(ours, [1, 0.125, 1, 1])), _logits(theirs, [1, 2, 1, 1]))
    assert found["first_difference"] == 1 and found["steps_differing"] == 2
    assert (found["top2_gap_at_difference"], found["reference_top2_gap_at_difference"]) == (0.125, 2.0)

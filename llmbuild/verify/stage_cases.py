"""Inputs and expected outputs of each stage, cut from one transformers forward pass.

The reference run feeds T = n1 + n2 + 1 tokens: the first n1 (= L) exercise `prefill`, the next n2
exercise `prefill_kv` with the first n1 as history, and the last one `decode` with all others as history.
A linear-attention layer's history is its state after the earlier tokens (the reference records it after
each stage); it gives the state after its own tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmbuild.importer.shapes import Shapes
from llmbuild.numerics import masks


def split_lengths(shapes: Shapes, check_tokens: int) -> tuple[int, int]:
    """prefill n1 rows, prefill_kv n2 more, decode one: n1 + n2 + 1 <= S, also when L == S. At most
    `check_tokens` (verify.check_tokens) each: the reference and the checks then cost the same at
    L = 8192 as at L = 128, and the padding rows of a net are not computed where they are not checked."""
    n1 = min(shapes.prefill_length, max(1, shapes.seq_length - 2), check_tokens)
    n2 = max(1, min(shapes.prefill_length, shapes.seq_length - n1 - 1, check_tokens))
    return n1, n2


@dataclass
class StageCase:
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]  # real rows only
    rows: int  # real tokens
    tokens: int = 0  # the net's static tokens (rows + padding); 0: the same as rows

    @property
    def padded(self) -> bool:
        return self.tokens > self.rows


def _pad(rows: np.ndarray, width: int) -> np.ndarray:
    out = np.zeros((width, *rows.shape[1:]), dtype=np.float32)
    out[: len(rows)] = rows
    return out


def stage_case(stage: str, ref: dict[str, np.ndarray], layer: int, shapes: Shapes, check_tokens: int) -> StageCase:
    L, S = shapes.prefill_length, shapes.seq_length
    n1, n2 = split_lengths(shapes, check_tokens)
    x, y = ref[f"layers.{layer}.input"], ref[f"layers.{layer}.output"]
    if stage == "prefill":
        lo, hi, hist = 0, n1, 0
        pos, mask = masks.prefill(n1, L, S)
        width = L
    elif stage == "prefill_kv":
        lo, hi, hist = n1, n1 + n2, n1
        pos, mask = masks.prefill_kv(n2, n1, L, S)
        width = L
    else:
        lo, hi, hist = n1 + n2, n1 + n2 + 1, n1 + n2
        pos, mask = masks.decode(hist, S)
        width = 1
    inputs = {
        "hidden_states": _pad(x[lo:hi], width)[None],
        "position_ids": pos,
        "attention_mask": mask,  # float32: at L = S = 8192 the prefill_kv mask alone is 512 MB
    }
    if f"layers.{layer}.state.{stage}.recurrent" in ref:
        return _linear_case(stage, ref, layer, inputs, y[lo:hi], width)
    k, v = ref[f"layers.{layer}.k"], ref[f"layers.{layer}.v"]
    if stage != "prefill":
        inputs["history_k"] = _pad(k[:hist], S)[None]
        inputs["history_v"] = _pad(v[:hist], S)[None]
    expected = {"hidden_states": y[lo:hi], "present_k": k[lo:hi], "present_v": v[lo:hi]}
    return StageCase(inputs, expected, hi - lo, width)


PREVIOUS_STAGE = {"prefill_kv": "prefill", "decode": "prefill_kv"}


def _linear_case(stage: str, ref: dict[str, np.ndarray], layer: int, inputs: dict[str, np.ndarray],
                 y: np.ndarray, width: int) -> StageCase:
    """A linear-attention layer's stage: the state the previous stage left as input, its own as expected
    output (the new window rows, `present_conv`, are the qkv projection's: the next stage's window checks
    them), and for a prefill the token mask of its real rows."""
    rows = len(y)
    if stage != "decode":
        mask = np.zeros((1, width, 1), np.float32)
        mask[0, :rows] = 1
        inputs["token_mask"] = mask
    if stage in PREVIOUS_STAGE:
        before = f"layers.{layer}.state.{PREVIOUS_STAGE[stage]}."
        inputs["state_conv"] = ref[before + "conv"][None]
        inputs["state_recurrent"] = ref[before + "recurrent"][None]
    expected = {"hidden_states": y, "present_recurrent": ref[f"layers.{layer}.state.{stage}.recurrent"][None]}
    return StageCase(inputs, expected, rows, width)

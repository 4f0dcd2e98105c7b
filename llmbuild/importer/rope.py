"""RoPE cos/sin tables, computed once at import (a constant transform, folded here) in float32, in the order
of operations of transformers' rotary embeddings (`1 / base ** (arange(0, d, 2) / d)`, one product per
position, cos and sin of the float32 angle) with numpy's float32 functions, as the incumbent's converter
computes them. transformers' torch functions round some of these in the last bit otherwise (5 of SmolLM2's
32 inverse frequencies), so no table equals the reference's exactly; computed in float64, a 512-position
model's tables differ from the incumbent's in 26 bf16 values, and every exported block with them.
"""

from __future__ import annotations

import math

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.families.spec import ModelSpec


def inverse_frequencies(spec: ModelSpec) -> np.ndarray:
    d = spec.rope_dim  # the head's dimensions the embedding turns (all of them but in a partial rotary)
    inv = np.float32(1.0) / (np.float32(spec.rope_theta) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))
    scaling = dict(spec.rope_scaling)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return (inv / np.float32(scaling["factor"])).astype(np.float32)
    if kind == "llama3":
        return _llama3(inv, scaling)
    raise LlmbuildError(f"rope_scaling type {kind!r} is not supported (expected default, linear or llama3)")


def _llama3(inv: np.ndarray, s: dict) -> np.ndarray:
    # Llama 3.1's frequency-dependent scaling: long wavelengths are divided by `factor`,
    # short ones kept, and the band between interpolated smoothly (float32, as transformers computes it).
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_ctx = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old_ctx / low, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    mid = ~(wavelen < old_ctx / high) & ~(wavelen > old_ctx / low)
    return np.where(mid, smoothed, scaled).astype(np.float32)


def rope_tables(spec: ModelSpec, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables [positions, rope_dim] in the rotate-half layout, as float32."""
    freqs = np.outer(np.arange(positions, dtype=np.float32), inverse_frequencies(spec)).astype(np.float32)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)

"""RoPE cos/sin tables, computed once in float64 at import (a constant transform, folded here)."""

from __future__ import annotations

import math

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.frontend.spec import ModelSpec


def inverse_frequencies(spec: ModelSpec) -> np.ndarray:
    d = spec.head_dim
    inv = 1.0 / (spec.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    scaling = dict(spec.rope_scaling)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        return _llama3(inv, scaling)
    raise LlmbuildError(f"rope_scaling type {kind!r} is not supported (expected default, linear or llama3)")


def _llama3(inv: np.ndarray, s: dict) -> np.ndarray:
    # Llama 3.1's frequency-dependent scaling: long wavelengths are divided by `factor`,
    # short ones kept, and the band between interpolated smoothly.
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_ctx = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    smooth = (old_ctx / wavelen - low) / (high - low)
    scaled = np.where(wavelen > old_ctx / low, inv / factor, inv)
    mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
    return np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)


def rope_tables(spec: ModelSpec, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables [positions, head_dim] in the rotate-half layout, as float32."""
    freqs = np.outer(np.arange(positions, dtype=np.float64), inverse_frequencies(spec))
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)

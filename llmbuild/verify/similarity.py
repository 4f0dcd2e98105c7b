"""The incumbent's two similarity measures, so tolerances mean what TPU-MLIR users expect.

A tensor holding NaN or Inf has no similarity: both measures are then -1.0, below every tolerance, so a
broken layer can never pass a check (a NaN compared with `<` would).
"""

from __future__ import annotations

import math

import numpy as np

NOT_FINITE = -1.0


def _flat64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).reshape(-1)


def _measures(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(cosine, euclid) from one float64 conversion of each tensor and four dot products."""
    a, b = _flat64(a), _flat64(b)
    aa, bb, ab = float(np.dot(a, a)), float(np.dot(b, b)), float(np.dot(a, b))
    if not (math.isfinite(aa) and math.isfinite(bb) and math.isfinite(ab)):
        return NOT_FINITE, NOT_FINITE
    diff = a - b
    dd = float(np.dot(diff, diff))
    if aa == 0 and bb == 0:
        cos = 1.0
    elif aa == 0 or bb == 0:
        cos = 0.0
    else:
        cos = ab / math.sqrt(aa * bb)
    half = max(aa + bb + 2 * ab, 0.0) / 4  # ||(a + b) / 2||^2, with no cancellation when a ~ b
    euc = (1.0 if dd == 0 else 0.0) if half == 0 else 1.0 - math.sqrt(dd / half)
    return cos, euc


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return _measures(a, b)[0]


def euclid(a: np.ndarray, b: np.ndarray) -> float:
    """1 - ||a - b|| / ||(a + b) / 2||: 1.0 for identical tensors."""
    return _measures(a, b)[1]


def similarity(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    cos, euc = _measures(a, b)
    return {"cosine": round(cos, 7), "euclid": round(euc, 7)}

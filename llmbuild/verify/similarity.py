"""The incumbent's two similarity measures, so tolerances mean what TPU-MLIR users expect."""

from __future__ import annotations

import numpy as np


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def euclid(a: np.ndarray, b: np.ndarray) -> float:
    """1 - ||a - b|| / ||(a + b) / 2||: 1.0 for identical tensors."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    denom = np.linalg.norm((a + b) / 2)
    if denom == 0:
        return 1.0 if np.linalg.norm(a - b) == 0 else 0.0
    return float(1.0 - np.linalg.norm(a - b) / denom)


def similarity(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    return {"cosine": round(cosine(a, b), 7), "euclid": round(euclid(a, b), 7)}

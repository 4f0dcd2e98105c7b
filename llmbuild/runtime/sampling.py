"""Choosing the next token from the logits: greedy, or sampling with temperature, top-k, top-p and a
repetition penalty, reproducible from a seed.

The order and formulas are transformers' logits processors, computed in float64:
1. repetition penalty over the last `repetition_window` tokens of the context (each distinct token once):
   a positive logit is divided by the penalty, a negative one multiplied;
2. greedy (temperature 0, or top-k 1): the largest penalized logit (the first, on a tie);
3. otherwise logits / temperature; top-k keeps the logits >= the k-th largest; softmax; top-p keeps the
   most probable tokens, in order, until their probability reaches p (at least one); renormalize;
4. one draw u ~ U[0, 1) from the session's numpy Generator picks the token by the cumulative distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from llmbuild import LlmbuildError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no top-k
    top_p: float = 1.0  # 1: no top-p
    repetition_penalty: float = 1.0  # 1: none
    repetition_window: int = 64  # how many of the last context tokens the penalty looks at
    seed: int | None = None  # None: a fresh seed per session

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise LlmbuildError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise LlmbuildError(f"top_k must be >= 0 (0 turns it off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise LlmbuildError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0:
            raise LlmbuildError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.repetition_window < 0:
            raise LlmbuildError(f"repetition_window must be >= 0, got {self.repetition_window}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def penalize(logits: np.ndarray, recent: Sequence[int], penalty: float) -> np.ndarray:
    """float64 logits with the repetition penalty applied to each distinct token of `recent`."""
    out = np.array(logits, dtype=np.float64)
    if penalty != 1.0 and len(recent):
        seen = np.unique(np.asarray(recent, dtype=np.int64))
        vals = out[seen]
        out[seen] = np.where(vals > 0, vals / penalty, vals * penalty)
    return out


def distribution(logits: np.ndarray, recent: Sequence[int], cfg: SamplingConfig) -> np.ndarray:
    """The float64 probabilities the sampler draws from (for a non-greedy config)."""
    x = penalize(logits, recent, cfg.repetition_penalty) / cfg.temperature
    if 0 < cfg.top_k < x.size:
        kth = np.partition(x, x.size - cfg.top_k)[x.size - cfg.top_k]
        x = np.where(x >= kth, x, -np.inf)
    probs = np.exp(x - x.max())
    probs /= probs.sum()
    if cfg.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        keep = int(np.searchsorted(cumulative, cfg.top_p, side="left")) + 1
        mask = np.zeros(probs.size, dtype=bool)
        mask[order[:keep]] = True
        probs = np.where(mask, probs, 0.0)
        probs /= probs.sum()
    return probs


class Sampler:
    """Picks tokens for one session; its Generator makes a seeded session reproducible."""

    def __init__(self, cfg: SamplingConfig):
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)

    def reseed(self) -> None:
        self.rng = np.random.default_rng(self.cfg.seed)

    def choose(self, logits: np.ndarray, context: Sequence[int] = ()) -> int:
        cfg = self.cfg
        recent = context[-cfg.repetition_window :] if cfg.repetition_window else ()
        if cfg.greedy:
            scores = logits if cfg.repetition_penalty == 1.0 else penalize(logits, recent, cfg.repetition_penalty)
            return int(np.argmax(scores))
        probs = distribution(logits, recent, cfg)
        kept = np.flatnonzero(probs)
        cdf = np.cumsum(probs[kept])
        i = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
        return int(kept[min(i, kept.size - 1)])

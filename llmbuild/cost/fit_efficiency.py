"""Fitting the cost model's efficiencies to the incumbent's published end-to-end figures.

Two published points (one BM1684X, w4bf16, static shapes; docs/design.md, "The fit"), each with a
first-token latency (FTL) and a decode speed: four numbers. The incumbent's schedule (`INCUMBENT` in
schedule.py) is what ran there, so the fit times that schedule and solves for three efficiencies:

1. decode speed of both points -> `ddr` (sustained DMA fraction) and `launch_s` (host launch per net),
   exactly (two equations, two unknowns; solved by bisection on `ddr`, since a decode step is DMA-bound
   but not exactly linear in 1/ddr);
2. FTL of both points -> `mac` (MAC utilisation), by least squares on log(model / published): one
   unknown, two equations, so one residual is a genuine check of the model's structure (how prefill cost
   grows with L through the [heads, L, L] attention scores the incumbent writes to DDR);
3. repeat 1-2 until `mac` settles (decode barely depends on it).

Decode errors are therefore zero by construction; the FTL errors are the test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmbuild import LlmbuildError
from llmbuild.chips import load_chip
from llmbuild.cost.chip_estimate import Estimate, StepModel, estimate
from llmbuild.cost.efficiency import Efficiency
from llmbuild.cost.schedule import INCUMBENT, LLMBUILD, Schedule
from llmbuild.families.spec import ModelSpec


def _qwen2(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int, rope_theta: float,
           eps: float) -> ModelSpec:
    return ModelSpec(
        architecture="qwen2", hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=hidden // heads, intermediate_size=ffn, vocab_size=vocab, rms_norm_eps=eps, rope_theta=rope_theta,
        tie_word_embeddings=False, qkv_bias=True, qk_norm=False, max_position_embeddings=131072,
        bos_token_id=151643, eos_token_ids=(151643,),
    )


@dataclass(frozen=True)
class PublishedPoint:
    recipe: str  # the shipped recipe with these shapes
    spec: ModelSpec
    mode: str
    group_size: int
    chip: str
    seq_length: int
    prefill_length: int  # the incumbent's static prefill covers the whole window
    first_token_latency_s: float
    decode_tokens_per_s: float


# SE7-32 box, one BM1684X, SDK V24.04.01, INT4 weights (w4bf16), static shapes.
PUBLISHED: tuple[PublishedPoint, ...] = (
    PublishedPoint("deepseek_r1_qwen_1_5b_w4", _qwen2(1536, 28, 12, 2, 8960, 151936, 10000.0, 1e-6),
                   "w4bf16", 64, "bm1684x", 8192, 8192, 5.431, 28.878),
    PublishedPoint("deepseek_r1_qwen_14b_w4", _qwen2(5120, 48, 40, 8, 13824, 152064, 1000000.0, 1e-5),
                   "w4bf16", 64, "bm1684x", 512, 512, 1.400, 5.564),
)


def model_point(p: PublishedPoint, eff: Efficiency | None = None, schedule: Schedule = INCUMBENT) -> Estimate:
    return estimate(p.spec, p.mode, p.group_size, p.chip, p.seq_length, p.prefill_length, schedule=schedule,
                    efficiency=eff)


def _steps(p: PublishedPoint, schedule: Schedule) -> StepModel:
    return StepModel(p.spec, p.mode, p.group_size, load_chip(p.chip), p.seq_length, p.prefill_length, schedule)


def _bisect(f, lo: float, hi: float, tol: float = 1e-6) -> float:
    flo = f(lo)
    if flo * f(hi) > 0:
        raise LlmbuildError(f"calibration: no solution in [{lo}, {hi}]")
    while hi - lo > tol:
        mid = (lo + hi) / 2
        fmid = f(mid)
        if (fmid > 0) == (flo > 0):
            lo, flo = mid, fmid
        else:
            hi = mid
    return (lo + hi) / 2


def _fit_decode(points: tuple[PublishedPoint, ...], models: list[StepModel], mac: float) -> tuple[float, float]:
    """(ddr, launch_s) that reproduce both decode speeds. A launch adds its time once per net."""
    (a, b), (ma, mb) = points, models

    def step(m: StepModel, ddr: float) -> float:  # decode step time without launches
        return sum(m.step_times("decode", Efficiency(ddr, mac, 0.0)))

    def nets(p: PublishedPoint) -> int:
        return p.spec.num_layers + 2  # embedding_cache, every block_cache, lm_head

    def launch(ddr: float) -> float:
        return (1 / a.decode_tokens_per_s - step(ma, ddr)) / nets(a)

    ddr = _bisect(lambda d: step(mb, d) + nets(b) * launch(d) - 1 / b.decode_tokens_per_s, 0.2, 1.0)
    if launch(ddr) < 0:
        raise LlmbuildError("calibration: the decode points need a negative launch time")
    return ddr, launch(ddr)


def _fit_mac(points: tuple[PublishedPoint, ...], models: list[StepModel], ddr: float, launch_s: float) -> float:
    """The MAC utilisation minimising the squared log errors of the FTLs (golden-section search)."""

    def loss(mac: float) -> float:
        eff = Efficiency(ddr, mac, launch_s)
        return sum(math.log(sum(m.step_times("prefill", eff)) / p.first_token_latency_s) ** 2
                   for p, m in zip(points, models, strict=True))

    g = (math.sqrt(5) - 1) / 2
    lo, hi = 0.05, 1.0
    m1, m2 = hi - g * (hi - lo), lo + g * (hi - lo)
    l1, l2 = loss(m1), loss(m2)
    while hi - lo > 1e-5:
        if l1 < l2:
            hi, m2, l2 = m2, m1, l1
            m1 = hi - g * (hi - lo)
            l1 = loss(m1)
        else:
            lo, m1, l1 = m1, m2, l2
            m2 = lo + g * (hi - lo)
            l2 = loss(m2)
    return (lo + hi) / 2


def fit(points: tuple[PublishedPoint, ...] = PUBLISHED, schedule: Schedule = INCUMBENT) -> Efficiency:
    """The efficiencies for which `schedule` (the incumbent's) reproduces `points` (see the module doc)."""
    if len(points) != 2:
        raise LlmbuildError(f"calibration: expected two published points, got {len(points)}")
    models = [_steps(p, schedule) for p in points]
    mac = 0.5
    for _ in range(50):
        ddr, launch_s = _fit_decode(points, models, mac)
        new_mac = _fit_mac(points, models, ddr, launch_s)
        if abs(new_mac - mac) < 1e-5:
            break
        mac = new_mac
    return Efficiency(ddr=ddr, mac=new_mac, launch_s=launch_s)


def calibration_rows(eff: Efficiency | None = None, schedule: Schedule = INCUMBENT) -> list[dict]:
    """Per published point: what the incumbent's schedule gives against what was measured, the measured
    roofline fraction, and what our schedule gives with the same efficiencies."""
    rows = []
    for p in PUBLISHED:
        inc, ours = model_point(p, eff, schedule), model_point(p, eff, LLMBUILD)
        rows.append({
            "recipe": p.recipe,
            "seq_length": p.seq_length,
            "published_ftl_s": p.first_token_latency_s,
            "model_ftl_s": inc.first_token_latency_s,
            "ftl_error": inc.first_token_latency_s / p.first_token_latency_s - 1,
            "published_tokens_per_s": p.decode_tokens_per_s,
            "model_tokens_per_s": inc.decode_tokens_per_s,
            "tokens_per_s_error": inc.decode_tokens_per_s / p.decode_tokens_per_s - 1,
            "published_roofline_fraction": p.decode_tokens_per_s / inc.decode_roofline_tokens_per_s,
            "ours_ftl_s": ours.first_token_latency_s,
            "ours_tokens_per_s": ours.decode_tokens_per_s,
            "ours_roofline_fraction": ours.decode_roofline_fraction,
            "ours_sustained_fraction": ours.decode_sustained_fraction,
        })
    return rows

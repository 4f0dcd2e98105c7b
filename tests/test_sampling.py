"""Sampling: the distribution matches a float64 reference of the same formula, draws follow it, a seed
reproduces them, temperature 0 and top-k 1 are greedy; stop strings and streamed text."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from llmbuild import LlmbuildError
from llmbuild.runtime.sampling import Sampler, SamplingConfig, distribution
from llmbuild.runtime.stream import TextStream


def reference(logits: np.ndarray, recent: list[int], t: float, k: int, p: float, penalty: float) -> np.ndarray:
    """The formula of sampling.py, written out one token at a time in float64."""
    x = [float(v) for v in logits]
    for tok in set(recent):
        x[tok] = x[tok] / penalty if x[tok] > 0 else x[tok] * penalty
    x = [v / t for v in x]
    if 0 < k < len(x):
        kth = sorted(x, reverse=True)[k - 1]
        x = [v if v >= kth else -math.inf for v in x]
    top = max(x)
    e = [math.exp(v - top) for v in x]
    total = sum(e)
    probs = [v / total for v in e]
    if p < 1:
        order = sorted(range(len(probs)), key=lambda i: -probs[i])  # stable: ties keep the lower id first
        kept, mass = set(), 0.0
        for i in order:
            kept.add(i)
            mass += probs[i]
            if mass >= p:
                break
        probs = [v if i in kept else 0.0 for i, v in enumerate(probs)]
        total = sum(probs)
        probs = [v / total for v in probs]
    return np.array(probs)


def test_distribution_matches_the_float64_reference_on_random_cases() -> None:
    rng = np.random.default_rng(0)
    for case in range(300):
        n = int(rng.integers(2, 80))
        logits = (rng.standard_normal(n) * rng.uniform(0.1, 8)).astype(np.float32)
        if case % 5 == 0:  # ties and repeated values
            logits = np.round(logits)
        recent = [int(i) for i in rng.integers(0, n, size=int(rng.integers(0, 12)))]
        cfg = SamplingConfig(
            temperature=float(rng.uniform(0.05, 3)),
            top_k=int(rng.integers(0, n + 2)) if case % 3 else 0,
            top_p=float(rng.uniform(0.05, 1)) if case % 4 else 1.0,
            repetition_penalty=float(rng.uniform(0.5, 2.5)) if case % 2 else 1.0,
        )
        got = distribution(logits, recent, cfg)
        want = reference(logits, recent, cfg.temperature, cfg.top_k, cfg.top_p, cfg.repetition_penalty)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15, err_msg=f"case {case}: {cfg}")
        assert np.array_equal(got > 0, want > 0), f"case {case}: kept tokens differ"


def test_draws_follow_the_distribution() -> None:
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0, 3.0], dtype=np.float32)
    cfg = SamplingConfig(temperature=0.8, top_k=5, top_p=0.9, seed=11)
    probs = distribution(logits, [], cfg)
    sampler = Sampler(cfg)
    counts = np.bincount([sampler.choose(logits) for _ in range(20000)], minlength=logits.size)
    assert np.all(counts[probs == 0] == 0)
    np.testing.assert_allclose(counts / counts.sum(), probs, atol=0.015)


def test_a_seed_reproduces_the_draws_and_reseed_restarts_them() -> None:
    logits = np.random.default_rng(1).standard_normal(300).astype(np.float32)
    cfg = SamplingConfig(temperature=1.2, top_p=0.95, seed=5)
    a, b = Sampler(cfg), Sampler(cfg)
    draws = [a.choose(logits) for _ in range(50)]
    assert draws == [b.choose(logits) for _ in range(50)]
    a.reseed()
    assert draws == [a.choose(logits) for _ in range(50)]
    assert draws != [Sampler(SamplingConfig(temperature=1.2, top_p=0.95, seed=6)).choose(logits) for _ in range(50)]


def test_temperature_zero_and_top_k_one_are_greedy() -> None:
    rng = np.random.default_rng(2)
    for _ in range(50):
        logits = rng.standard_normal(200).astype(np.float32)
        assert Sampler(SamplingConfig(temperature=0.0)).choose(logits) == int(np.argmax(logits))
        assert Sampler(SamplingConfig(temperature=1.7, top_k=1, seed=3)).choose(logits) == int(np.argmax(logits))


def test_the_repetition_penalty_applies_to_greedy_too_and_only_within_its_window() -> None:
    logits = np.array([1.0, 3.0, 2.9, -1.0], dtype=np.float32)
    cfg = SamplingConfig(repetition_penalty=1.5, repetition_window=2)
    assert Sampler(cfg).choose(logits, [1, 0, 3]) == 1  # token 1 is outside the last two
    assert Sampler(cfg).choose(logits, [0, 1]) == 2  # 3 / 1.5 < 2.9


@pytest.mark.parametrize("bad", [{"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"top_k": -2},
                                 {"repetition_penalty": 0}])
def test_bad_settings_are_one_line_errors(bad: dict) -> None:
    with pytest.raises(LlmbuildError) as info:
        SamplingConfig(**bad)
    assert "\n" not in str(info.value)


# ---- streamed text and stop strings ------------------------------------------------------------------


def _bytes_decoder(pieces: dict[int, bytes]):
    return lambda ids: b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")


def test_stream_waits_for_whole_characters() -> None:
    euro = "€".encode()
    stream = TextStream(_bytes_decoder({1: b"a", 2: euro[:1], 3: euro[1:2], 4: euro[2:]}))
    assert [stream.push(t) for t in (1, 2, 3, 4)] == ["a", "", "", "€"]


def test_stream_never_shows_a_stop_string() -> None:
    pieces = {1: b"Hello", 2: b" Us", 3: b"er", 4: b": more", 5: b" Use"}
    stream = TextStream(_bytes_decoder(pieces), stops=["User:"])
    shown = [stream.push(t) for t in (1, 2, 5)]  # "Us" may start "User:"; then it cannot, but "Use" may
    assert shown == ["Hello", " ", "Us "]
    stream = TextStream(_bytes_decoder(pieces), stops=["User:"])
    shown = [stream.push(t) for t in (1, 2, 3, 4)]
    assert "".join(shown) == "Hello " and stream.stopped and stream.text == "Hello "
    stream = TextStream(_bytes_decoder(pieces), stops=["xyz"])
    assert "".join(stream.push(t) for t in (1, 2, 3)) + stream.flush() == "Hello User"


# ---- in a session ----------------------------------------------------------------------------------------


def _binary(build: Path) -> Path:
    return build / "qwen2_tiny_f32" / "qwen2_tiny_f32.llmb"


def test_session_sampling_is_reproducible_and_temperature_zero_is_greedy(runtime_build: Path) -> None:
    from llmbuild.runtime.session import Session

    def reply(**sampling: float | int) -> list[int]:
        return Session(_binary(runtime_build), ignore_eos=True, **sampling).generate([1, 5, 9, 42], 16)

    greedy = reply()
    assert reply(temperature=0.0, top_p=0.5, seed=1) == greedy
    assert reply(temperature=2.0, top_k=1, seed=1) == greedy
    sampled = reply(temperature=1.5, top_p=0.98, seed=1)
    assert sampled == reply(temperature=1.5, top_p=0.98, seed=1) and sampled != greedy


def test_session_stops_before_a_stop_string(runtime_build: Path) -> None:
    from llmbuild.runtime.session import Session

    s = Session(_binary(runtime_build), ignore_eos=True)
    s.generate([1, 5, 9, 42], 16)
    text = s.last_reply.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop and stop.strip()
    s = Session(_binary(runtime_build), ignore_eos=True, stop=[stop])
    shown: list[str] = []
    s.generate([1, 5, 9, 42], 16, stream=shown.append)
    reply = s.last_reply
    assert reply.finish == "stop" and reply.text == text[: text.index(stop)] == "".join(shown)

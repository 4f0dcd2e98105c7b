"""Conversations: history kept in the KV cache between turns, long prompts in chunks, the cache-full
policies, chat templates as transformers renders them, and `llmbuild chat` / `llmbuild run`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import hf_generate, llmbuild

from llmbuild import LlmbuildError
from llmbuild.runtime.compiled_model import CacheFullError, CompiledModel
from llmbuild.runtime.session import Session

PROMPT = [1, 5, 9, 42]


def _binary(build: Path, recipe: str) -> Path:
    return build / recipe / f"{recipe}.llmb"


def _ids(n: int, seed: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(3, 500, size=n)]


# ---- history ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", ["qwen2_tiny_f32", "llama_tiny_f32"])
def test_second_turn_runs_prefill_kv_on_its_tokens_only_and_matches_transformers(
    runtime_build: Path, recipe: str
) -> None:
    s = Session(_binary(runtime_build, recipe))
    first = s.generate(PROMPT, 6)
    after_first = s.stats
    second_prompt = [7, 8, 9, 10, 11]
    second = s.generate(second_prompt, 6)
    want, _ = hf_generate(runtime_build / recipe / "checkpoint", PROMPT + first + second_prompt, 6)
    assert second == want
    assert after_first == {"prefill": len(PROMPT), "prefill_kv": 0, "decode": len(first) - 1}
    # Turn two feeds the first reply's last token and its own prompt, by prefill_kv; nothing is rerun.
    assert s.stats["prefill"] == len(PROMPT)
    assert s.stats["prefill_kv"] == 1 + len(second_prompt)
    assert sum(s.stats.values()) == len(s.ids) - 1  # every token once; the last reply token is not fed yet
    assert s.ids == PROMPT + first + second_prompt + second


@pytest.mark.parametrize("recipe", ["qwen2_tiny_f32", "smollm2_135m_bf16"])
def test_a_session_reads_its_weights_when_it_loads(runtime_build: Path, recipe: str) -> None:
    """The host path reads the weights of the nets a conversation runs when the session loads, so a first
    turn (prefill, decode) reads none and binds no new program; its tokens are those of a model that reads
    its weights as it runs."""
    s = Session(_binary(runtime_build, recipe), ignore_eos=True)
    host = s.model.device
    loaded, kept, programs = set(host._weights), host.cached_bytes, set(host._programs)
    assert loaded and kept > 0 and s.load_s > 0
    s.model.reset()
    ids, _ = s.model.generate(PROMPT, 4)
    assert set(host._weights) == loaded and host.cached_bytes == kept and set(host._programs) == programs
    lazy = CompiledModel(_binary(runtime_build, recipe), faithful=False)
    assert lazy.generate(PROMPT, 4)[0] == ids
    assert set(lazy.device._weights) <= loaded


def test_a_prompt_of_three_chunks_matches_transformers(runtime_build: Path) -> None:
    s = Session(_binary(runtime_build, "llama_tiny_f32"))
    L = s.model.L
    prompt = _ids(3 * L, seed=3)
    got = s.generate(prompt, 10)
    want, _ = hf_generate(runtime_build / "llama_tiny_f32" / "checkpoint", prompt, 10)
    assert got == want
    assert (s.stats["prefill"], s.stats["prefill_kv"]) == (L, 2 * L)


def test_reset_starts_a_new_conversation(runtime_build: Path) -> None:
    s = Session(_binary(runtime_build, "qwen2_tiny_f32"))
    first = s.generate(PROMPT, 5)
    s.generate([7, 8], 5)
    s.reset()
    assert s.stats == {"prefill": 0, "prefill_kv": 0, "decode": 0} and s.ids == []
    assert s.generate(PROMPT, 5) == first


def test_send_and_generate_do_not_mix_in_one_conversation(runtime_build: Path) -> None:
    s = Session(_binary(runtime_build, "qwen2_tiny_f32"))
    s.generate(PROMPT, 2)
    with pytest.raises(LlmbuildError, match="reset"):
        s.send("hello")


# ---- a full cache ----------------------------------------------------------------------------------


def test_stop_policy_refuses_a_turn_that_does_not_fit_and_keeps_the_conversation(runtime_build: Path) -> None:
    s = Session(_binary(runtime_build, "qwen2_tiny_f32"), ignore_eos=True)
    S = s.model.S
    s.generate(_ids(S - 20, seed=1), 8)
    before = (list(s.ids), dict(s.stats))
    with pytest.raises(CacheFullError) as info:
        s.generate(_ids(20, seed=2), 8)
    message = str(info.value)
    assert "\n" not in message and f"capacity of {S}" in message and "drop_oldest" in message
    assert (s.ids, s.stats) == before
    # The conversation goes on with a turn that fits.
    s.generate([3, 4], 4)


def test_stop_policy_stops_a_reply_that_fills_the_cache(runtime_build: Path) -> None:
    s = Session(_binary(runtime_build, "qwen2_tiny_f32"), ignore_eos=True)
    S = s.model.S
    with pytest.raises(CacheFullError, match=f"capacity of {S} tokens during a reply"):
        s.generate(_ids(S - 4, seed=1), 10)
    assert s.ids == [] and s.model.history == 0  # the failed turn is undone


def test_drop_oldest_gives_what_a_fresh_session_on_the_kept_turns_gives(runtime_build: Path) -> None:
    binary = _binary(runtime_build, "llama_tiny_f32")
    a = Session(binary, policy="drop_oldest", ignore_eos=True)
    S = a.model.S
    turns = [_ids(20, seed=k) for k in range(3)]
    a.generate(turns[0], 8)
    a.generate(turns[1], 8)
    kept = a.ids[a.turn_starts[1] :]  # turn two: its prompt and reply
    assert len(a.ids) + len(turns[2]) > S
    before = sum(a.stats.values())
    reply = a.generate(turns[2], 8)
    assert a.last_reply is not None and a.last_reply.dropped_turns == 1
    assert a.turn_starts == [0, len(kept)] and a.ids == kept + turns[2] + reply
    fresh = Session(binary, ignore_eos=True)
    assert fresh.generate(kept + turns[2], 8) == reply
    # The kept turns were prefilled again, from an empty cache, as the fresh session did.
    assert sum(a.stats.values()) - before == sum(fresh.stats.values()) == len(kept) + 20 + 7


def test_drop_oldest_continues_a_reply_that_fills_the_cache(runtime_build: Path) -> None:
    binary = _binary(runtime_build, "qwen2_tiny_f32")
    a = Session(binary, policy="drop_oldest", ignore_eos=True)
    S = a.model.S
    first = _ids(20, seed=4)
    a.generate(first, 10)
    second = _ids(20, seed=5)
    reply = a.generate(second, 30)  # 30 + 30 + 20 > S: the cache fills during this reply
    assert len(reply) == 30 and a.last_reply is not None and a.last_reply.dropped_turns == 1
    # From the drop on, the reply is what a fresh session gives on what was kept (this turn so far).
    k = S + 1 - 30 - len(second)  # reply tokens when the cache was full (the last one not fed yet)
    fresh = Session(binary, ignore_eos=True)
    assert fresh.generate(second + reply[:k], 30 - k) == reply[k:]


def test_drop_oldest_chat_turns_match_a_fresh_session_on_the_kept_messages(runtime_build: Path) -> None:
    binary = _binary(runtime_build, "qwen2_tiny_f32")
    a = Session(binary, policy="drop_oldest", max_new_tokens=6, system="be brief")
    messages = ["hello there", "what is the weather like", "tell me a story", "and another one please"]
    replies = [a.send(m) for m in messages]
    assert a.last_reply is not None and a.last_reply.dropped_turns >= 1
    kept = a.messages[:-2]  # the system message and the turns kept before the last one
    assert kept[0] == {"role": "system", "content": "be brief"} and len(kept) < 1 + 2 * (len(messages) - 1)
    fresh = Session(binary, max_new_tokens=6, system="be brief")
    fresh.messages = [dict(m) for m in kept]
    assert fresh.send(messages[-1]) == replies[-1]


def test_a_message_longer_than_the_cache_is_refused_under_either_policy(runtime_build: Path) -> None:
    for policy in ("stop", "drop_oldest"):
        s = Session(_binary(runtime_build, "qwen2_tiny_f32"), policy=policy)
        with pytest.raises(CacheFullError, match="capacity"):
            s.generate(_ids(s.model.S + 1, seed=6), 4)


# ---- chat templates --------------------------------------------------------------------------------

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Nice to meet you, Ada!"},
        {"role": "user", "content": "Ünïcödé ✓ and\nnew lines  "},
    ],
]


@pytest.mark.parametrize("recipe", ["smollm2_135m_bf16", "qwen2_tiny_f32"])
def test_chat_templates_render_as_transformers_apply_chat_template(runtime_build: Path, recipe: str) -> None:
    from transformers import AutoTokenizer

    from llmbuild.runtime.compiled_model import CompiledModel, load_tokenizer

    ours = load_tokenizer(CompiledModel(_binary(runtime_build, recipe), faithful=False))
    theirs = AutoTokenizer.from_pretrained(runtime_build / recipe / "checkpoint")
    assert ours.chat_template == theirs.chat_template
    for messages in CONVERSATIONS:
        for gen in (True, False):
            text = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert ours.render(messages, add_generation_prompt=gen) == text
            want = theirs.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen)
            want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
            assert ours.chat_ids(messages, add_generation_prompt=gen) == list(want)


def test_a_template_cannot_reach_python_internals() -> None:
    from llmbuild.runtime.chat import render_chat

    with pytest.raises(LlmbuildError, match="chat template"):
        render_chat("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}", [])
    with pytest.raises(LlmbuildError, match="chat template: no system"):
        render_chat("{{ raise_exception('no system') }}", [])


# ---- the commands ----------------------------------------------------------------------------------


def test_llmbuild_chat_remembers_the_first_turn(runtime_build: Path) -> None:
    script = "Hello! I'm Ada Lovelace, a mathematician.\nWhat is my name?\n"
    r = llmbuild(runtime_build, "chat", "smollm2_135m_bf16", "--max-new-tokens", "24", stdin=script)
    assert r.returncode == 0, r.stderr
    replies = [line for line in r.stdout.splitlines() if line.startswith("assistant> ")]
    timings = [line for line in r.stdout.splitlines() if line.startswith("[host: first token ")]
    assert len(replies) == 2 and len(timings) == 2, r.stdout
    assert "tokens/s" in timings[0]
    # The second reply comes from the history: a Session given both turns answers as the chat did, and one
    # given the second turn alone answers otherwise. (Whether SmolLM2-135M then names Ada is a near-tie of
    # arithmetic: transformers in float64 and float32 answer "My name is Lillie Parke...", in bf16 "My dear
    # Ada"; 2026-12-03.)
    session = Session(_binary(runtime_build, "smollm2_135m_bf16"))
    turns = [session.send(line, max_new_tokens=24) for line in script.splitlines()]
    assert [reply.removeprefix("assistant> ").strip() for reply in replies] == [t.strip() for t in turns], r.stdout
    alone = Session(_binary(runtime_build, "smollm2_135m_bf16")).send("What is my name?", max_new_tokens=24)
    assert alone.strip() != turns[1].strip()


def test_llmbuild_run_samples_reproducibly_and_faithful_agrees(runtime_build: Path) -> None:
    def run(*extra: str) -> dict:
        r = llmbuild(runtime_build, "run", "qwen2_tiny_f32", "--prompt-ids", "1,5,9,42", "--max-new-tokens", "12",
                     "--json", "--ignore-eos", *extra)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    sampled = run("--temperature", "1.5", "--top-k", "40", "--top-p", "0.95", "--seed", "7")
    assert run("--temperature", "1.5", "--top-k", "40", "--top-p", "0.95", "--seed", "7")["ids"] == sampled["ids"]
    greedy = run()
    timed = run("--timing")
    assert timed["ids"] == greedy["ids"] and timed["load_s"] > 0 and timed["first_token_s"] > 0
    assert run("--faithful")["ids"] == greedy["ids"]
    assert sampled["ids"] != greedy["ids"]
    assert len(greedy["logits"]) == 12 and len(greedy["logits"][0]) == 512


def test_llmbuild_run_reports_bad_sampling_flags_in_one_line(runtime_build: Path) -> None:
    r = llmbuild(runtime_build, "run", "qwen2_tiny_f32", "--prompt-ids", "1,2", "--top-p", "1.5")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "top_p" in r.stderr, r.stderr

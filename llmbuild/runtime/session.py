"""A conversation on one compiled model.

The KV cache holds every earlier token, so a new turn runs `prefill_kv` on its new tokens only: nothing of
earlier turns is recomputed. Invariant: cache rows [0, model.history) hold `ids[:model.history]`; after a
reply its last token is not fed yet (the next turn feeds it with its own tokens).

A turn that does not fit the cache (capacity S) follows the session's policy: `stop` raises
`CacheFullError` and leaves the conversation as it was before the turn; `drop_oldest` drops the oldest
turns (a system message stays) and prefills what is kept from an empty cache, which is exactly what a
fresh session holding the kept turns would compute.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.runtime import resolve_binary
from llmbuild.runtime.compiled_model import (
    CacheFullError,
    CompiledModel,
    StageCounts,
    image_rows,
    image_runs,
    load_tokenizer,
)
from llmbuild.runtime.sampling import Sampler, SamplingConfig
from llmbuild.runtime.stream import TextStream

POLICIES = ("stop", "drop_oldest")
Stream = Callable[[str], None]


@dataclass
class Reply:
    """One reply and how it was produced (timings are host wall-clock seconds)."""

    ids: list[int]
    text: str
    finish: str  # "eos", "stop" (a stop string) or "length"
    prompt_tokens: int  # tokens fed before the first reply token (the turn's new tokens)
    first_token_s: float  # from the call to the first token chosen: tokenizing, prefill, sampling
    decode_s: float  # from the first token to the last
    dropped_turns: int = 0
    logits: list[np.ndarray] = field(default_factory=list)  # per step, when the session keeps them

    @property
    def tokens_per_s(self) -> float:
        return (len(self.ids) - 1) / self.decode_s if len(self.ids) > 1 and self.decode_s > 0 else 0.0


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Session:
    """`Session(recipe_or_binary, faithful=False, **sampling)`: see docs/runtime.md."""

    def __init__(
        self,
        recipe_or_binary: str | Path,
        faithful: bool = False,
        *,
        policy: str = "stop",
        max_new_tokens: int = 128,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        system: str | None = None,
        keep_logits: bool = False,
        **sampling: float | int | None,
    ):
        if policy not in POLICIES:
            raise LlmbuildError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        try:
            self.sampling = SamplingConfig(**sampling)  # type: ignore[arg-type]
        except TypeError as exc:
            raise LlmbuildError(f"Session: {exc}") from None
        started = time.perf_counter()
        self.model = CompiledModel(resolve_binary(str(recipe_or_binary)), faithful=faithful)
        self.tokenizer = load_tokenizer(self.model)
        self.model.load_weights()
        self.load_s = time.perf_counter() - started  # opening the binary, its tokenizer and its weights
        self.eos = frozenset(() if ignore_eos else self.model.meta.get("eos_token_ids") or ())
        self.vocab = int(self.model.meta["spec"]["vocab_size"])
        self.policy = policy
        self.max_new_tokens = max_new_tokens
        self.stops = tuple(stop)
        self.system = system
        self.keep_logits = keep_logits
        self.sampler = Sampler(self.sampling)
        self.reset()

    # ---- state ----------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the conversation, zero the stats, and restart the seeded sampler."""
        self.model.reset()
        self.model.counts = StageCounts()
        self.sampler.reseed()
        self.messages: list[dict[str, str]] = [{"role": "system", "content": self.system}] if self.system else []
        self.ids: list[int] = []  # every token of the conversation: prompts and replies
        self.turn_starts: list[int] = []  # raw-id turns: where each starts in `ids`
        self.mode: str | None = None  # "chat" (send) or "raw" (generate); a conversation is one or the other
        self.last_reply: Reply | None = None
        self.features: list[np.ndarray] = []  # the vit net's rows of every image in the conversation, in order

    @property
    def stats(self) -> dict[str, int]:
        """Tokens processed by each stage since the session started (or was reset)."""
        c = self.model.counts
        return {"prefill": c.prefill, "prefill_kv": c.prefill_kv, "decode": c.decode}

    def _enter(self, mode: str) -> None:
        if self.mode not in (None, mode):
            other = "send()" if self.mode == "chat" else "generate()"
            raise LlmbuildError(f"this session holds a conversation made with {other}: reset() it first")
        self.mode = mode

    # ---- the API ----------------------------------------------------------------------------------

    def image_pixels(self, images: Sequence[Any]) -> list[Any]:
        """Each image as the model family feeds it (runtime/vision.VisionNet.prepare): a file, read and
        tiled (InternVL: [tiles, 3, size, size]) or sliced (MiniCPM-V: a SlicedImage), or pixels already made."""
        if not images:  # a text turn: a text model has no vision net to ask
            return []
        return [self.model.vision.prepare(img) for img in images]

    def image_ids(self, image: Any, index: int = 0) -> list[int]:
        """The ids that stand for `image` in a raw prompt (its tile or slice count depends on its shape);
        `index`: its place among the images of the message (MiniCPM-V writes it)."""
        return self.model.vision.image_ids(self.image_pixels([image])[0], index)

    def _image_rows(self, prepared: Sequence[Any]) -> list[np.ndarray]:
        """The vit net's rows of these images, one array per run of image tokens (a MiniCPM-V image has one
        run per slice, so `features` and the prompt's runs correspond one to one)."""
        return [rows for p in prepared for rows in self.model.vision.run_rows(p)]

    def image_prompt(self, pixels: Sequence[np.ndarray]) -> str:
        if not pixels:  # a text turn: a text model has no vision net to ask
            return ""
        return image_prompt(self.tokenizer, self.model.vision, pixels)

    def send(self, message: str, max_new_tokens: int | None = None, stream: Stream | None = None,
             images: Sequence[str | Path | np.ndarray] = ()) -> str:
        """One chat turn: the reply's text (special tokens and any stop string left out). `images` come
        before the message, each as its run of image tokens."""
        self._enter("chat")
        before = (list(self.ids), list(self.messages))
        pixels = self.image_pixels(images)
        features = self._image_rows(pixels)
        self.messages.append({"role": "user", "content": self.image_prompt(pixels) + message})
        self.features.extend(features)
        try:
            reply = self._turn(self._chat_ids(), max_new_tokens, stream)
        except LlmbuildError:
            del self.features[len(self.features) - len(features):]
            self._restore(*before)
            raise
        self.messages.append({"role": "assistant", "content": reply.text})
        return reply.text

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int | None = None,
                 stream: Stream | None = None, images: Sequence[str | Path | np.ndarray] = ()) -> list[int]:
        """One turn of raw ids: the reply's ids (ending with the EOS id when it stopped there). The prompt
        holds a run of image tokens (`image_ids(image)`) for each of `images`, in order."""
        self._enter("raw")
        prompt = [int(i) for i in prompt_ids]
        if not prompt or min(prompt) < 0 or max(prompt) >= self.vocab:
            raise LlmbuildError(f"prompt ids must be a non-empty list in [0, {self.vocab}), got {prompt[:16]}")
        before = (list(self.ids), list(self.messages))
        starts = list(self.turn_starts)
        features = self._image_rows(self.image_pixels(images))
        self.features.extend(features)
        self.turn_starts.append(len(self.ids))
        try:
            reply = self._turn(self.ids + prompt, max_new_tokens, stream)
        except LlmbuildError:
            del self.features[len(self.features) - len(features):]
            self._restore(*before)
            self.turn_starts = starts
            raise
        return reply.ids

    # ---- one turn ---------------------------------------------------------------------------------

    def _turn(self, target: list[int], max_new_tokens: int | None, stream: Stream | None) -> Reply:
        start = time.perf_counter()
        limit = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        if limit < 1:
            raise LlmbuildError(f"max_new_tokens must be >= 1, got {limit}")
        dropped = 0
        if len(target) > self.model.S:
            target, dropped = self._make_room(target, [], limit)
        new_tokens = len(target) - self._feed_start(target)
        logits = self._feed(target)
        text = TextStream(self.tokenizer.decode, self.stops)
        out: list[int] = []
        kept: list[np.ndarray] = []
        first = finish = None
        while True:
            if self.keep_logits:
                kept.append(logits)
            token = self.sampler.choose(logits, self.ids)
            out.append(token)
            self.ids.append(token)
            if first is None:
                first = time.perf_counter()
            if token in self.eos:
                finish = "eos"
                break
            piece = text.push(token)
            if piece and stream is not None:
                stream(piece)
            if text.stopped:
                finish = "stop"
                break
            if len(out) == limit:
                finish = "length"
                break
            if self.model.history >= self.model.S:
                logits, more = self._full_mid_reply(out, limit)
                dropped += more
            else:
                logits = self.model.decode_token(token)
        rest = text.flush()
        if rest and stream is not None:
            stream(rest)
        assert first is not None
        reply = Reply(out, text.text, finish, new_tokens, first - start, time.perf_counter() - first, dropped, kept)
        self.last_reply = reply
        return reply

    def _feed_start(self, target: list[int]) -> int:
        """Where feeding `target` starts: after the cached rows it shares (at least its last token is fed)."""
        return min(_common_prefix(target, self.ids[: self.model.history]), len(target) - 1)

    def _feed(self, target: list[int]) -> np.ndarray:
        """Bring the cache to `target` (only what is not cached yet runs); the last token's logits."""
        keep = self._feed_start(target)
        if keep < self.model.history:
            self.model.truncate(keep)
            keep = self.model.history  # a model with linear-attention state starts over (compiled_model.py)
        self.ids = list(target)
        rows = None
        if self.features:
            # Every image's rows at its tokens; those before `keep` are already in the cache.
            every = image_rows(target, self.features, self.model.vision.meta)
            rows = {i - keep: v for i, v in every.items() if i >= keep}
        return self.model.prefill(target[keep:], rows)

    def _restore(self, ids: list[int], messages: list[dict[str, str]]) -> None:
        """The conversation as it was before a failed turn (cache rows that still match are kept)."""
        self.model.truncate(min(self.model.history, _common_prefix(ids, self.ids[: self.model.history])))
        self.ids, self.messages = ids, messages

    # ---- a full cache -----------------------------------------------------------------------------

    def _full_mid_reply(self, reply: list[int], limit: int) -> tuple[np.ndarray, int]:
        """The cache filled up during a reply: the policy decides (a `stop` error or dropped turns)."""
        if self.policy == "stop":
            raise CacheFullError(
                f"KV cache full: the conversation reached the capacity of {self.model.S} tokens during a "
                "reply; reset the session (/reset in chat) or use the drop_oldest policy"
            )
        target, dropped = self._make_room(self.ids[: len(self.ids) - len(reply)], reply, limit)
        return self._feed(target), dropped

    def _make_room(self, conversation: list[int], reply: list[int], limit: int) -> tuple[list[int], int]:
        """A conversation that fits, per the policy: (its ids, how many turns were dropped).

        `conversation` ends with this turn's prompt, `reply` is the reply so far. The fewest oldest turns
        go that leave room for the rest of the reply (all of them, when even that is not enough), and the
        cache restarts empty: what is kept is prefilled as a fresh session would.
        """
        S = self.model.S
        if self.policy == "stop":
            raise CacheFullError(
                f"KV cache full: this turn needs {len(conversation) + len(reply)} tokens, more than the "
                f"capacity of {S}; reset the session (/reset in chat) or use the drop_oldest policy"
            )
        room = limit - len(reply)
        kept, drop = conversation + reply, 0
        for drop in range(1, self._old_turns() + 1):
            kept = self._without_oldest(conversation, drop) + reply
            if len(kept) + room <= S:
                break
        if len(kept) > S:
            raise CacheFullError(
                f"KV cache full: this turn alone needs {len(kept)} tokens, more than the capacity of {S}; "
                "send a shorter message"
            )
        self._drop(drop)
        self._keep_features(kept)
        self.model.reset()
        return kept, drop

    def _keep_features(self, kept: list[int]) -> None:
        """Only the rows of the images still in the conversation: dropped turns take their images' runs of
        image tokens with them, the oldest first, so the newest features are the ones kept."""
        if not self.features:
            return
        runs = len(image_runs(kept, self.model.vision.meta))
        self.features = self.features[len(self.features) - runs :] if runs else []

    def _old_turns(self) -> int:
        """Earlier turns that may be dropped (this one and a system message stay)."""
        if self.mode == "raw":
            return len(self.turn_starts) - 1
        return sum(1 for m in self._turn_messages() if m["role"] == "user") - 1

    def _turn_messages(self) -> list[dict[str, str]]:
        return self.messages[1:] if self.messages and self.messages[0]["role"] == "system" else self.messages

    def _without_oldest(self, conversation: list[int], drop: int) -> list[int]:
        if self.mode == "raw":
            return conversation[self.turn_starts[drop] :]
        return self.tokenizer.chat_ids(self._messages_without(drop))

    def _messages_without(self, drop: int) -> list[dict[str, str]]:
        turns = self._turn_messages()
        head = self.messages[: len(self.messages) - len(turns)]
        users = [i for i, m in enumerate(turns) if m["role"] == "user"]
        return head + turns[users[drop] :]

    def _drop(self, drop: int) -> None:
        if drop == 0:
            return
        if self.mode == "raw":
            base = self.turn_starts[drop]
            self.turn_starts = [s - base for s in self.turn_starts[drop:]]
        else:
            self.messages = self._messages_without(drop)

    # ---- chat turns: reuse the cached tokens -------------------------------------------------------

    def _chat_ids(self) -> list[int]:
        """The ids of the conversation ending with the new message and the generation prompt.

        The template renders the whole conversation; the cached tokens are kept as far as their text is
        a prefix of it (the model's own reply tokens, not a re-tokenization), and only the rest is
        tokenized: the new turn's tokens, fed by prefill_kv.
        """
        text = self.tokenizer.render(self.messages, add_generation_prompt=True)
        keep = self._shared_prefix(text)
        head = self.tokenizer.decode_all(self.ids[:keep])
        return self.ids[:keep] + self.tokenizer.encode(text[len(head) :])

    def _shared_prefix(self, text: str) -> int:
        """The most tokens of `ids` whose text is a prefix of `text`."""

        def fits(k: int) -> bool:
            return text.startswith(self.tokenizer.decode_all(self.ids[:k]))

        k = len(self.ids)
        for _ in range(8):  # usually all of them, or all but the reply's last few tokens
            if k == 0 or fits(k):
                return k
            k -= 1
        lo, hi = 0, k  # fits(lo), not fits(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo


def image_prompt(tokenizer: Any, vision: Any, pixels: Sequence[Any]) -> str:
    """The text that stands for these prepared images at the start of a user message (InternVL: `<img>`, one
    `<IMG_CONTEXT>` per feature row, `</img>`, a new line, each); the tokenizer makes them special ids."""
    return "".join(tokenizer.decode_all(vision.image_ids(p, i)) + "\n" for i, p in enumerate(pixels))

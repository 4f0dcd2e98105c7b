"""A conversation on one compiled model: the KV cache holds every earlier token, so a new turn runs
`prefill_kv` on its new tokens only (nothing of earlier turns is recomputed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmbuild.runtime import resolve_binary
from llmbuild.runtime.model import CompiledModel, load_tokenizer


class Session:
    def __init__(self, recipe_or_binary: str | Path):
        self.model = CompiledModel(resolve_binary(str(recipe_or_binary)))
        self.tokenizer = load_tokenizer(self.model)
        self.eos = tuple(self.model.meta["eos_token_ids"])
        self.messages: list[dict[str, str]] = []
        self.ids: list[int] = []  # the conversation so far, every prompt and reply token
        self.cached: list[int] = []  # the prefix of `ids` whose k/v rows are in the cache

    def reset(self) -> None:
        self.model.reset()
        self.messages, self.ids, self.cached = [], [], []

    def _feed(self, ids: list[int]) -> np.ndarray:
        """Bring the cache to `ids`: only the part after the common prefix is run."""
        common = 0
        while common < min(len(ids), len(self.cached)) and ids[common] == self.cached[common]:
            common += 1
        if common < len(self.cached) or common == len(ids):
            # The history changed (or nothing is new): start the cache over.
            self.model.reset()
            self.cached, common = [], 0
        logits = self.model.prefill(ids[common:])
        self.cached = list(ids)
        return logits

    def generate(self, prompt_ids: list[int], max_new_tokens: int, stream=None) -> list[int]:
        """Greedy reply to raw ids appended to the history; the reply joins the history too."""
        self.ids = self.ids + list(prompt_ids)
        logits = self._feed(self.ids)
        out: list[int] = []
        while len(out) < max_new_tokens:
            token = int(np.argmax(logits))
            out.append(token)
            self.ids.append(token)
            if stream is not None:
                stream(token)
            if token in self.eos or len(out) == max_new_tokens:
                break
            logits = self.model.decode_token(token)
            self.cached.append(token)
        return out

    def send(self, message: str, max_new_tokens: int = 128, stream=None) -> str:
        self.messages.append({"role": "user", "content": message})
        self.ids = self.tokenizer.chat_ids(self.messages)
        logits = self._feed(self.ids)
        out: list[int] = []
        while len(out) < max_new_tokens:
            token = int(np.argmax(logits))
            if token in self.eos:
                break
            out.append(token)
            self.ids.append(token)
            if stream is not None:
                stream(token)
            if len(out) == max_new_tokens:
                break
            logits = self.model.decode_token(token)
            self.cached.append(token)
        reply = self.tokenizer.decode(out)
        self.messages.append({"role": "assistant", "content": reply})
        return reply

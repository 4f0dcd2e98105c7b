"""The tokenizer embedded in the binary (tokenizer.json, read by the `tokenizers` library)."""

from __future__ import annotations

from tokenizers import Tokenizer

from llmbuild.runtime.chat import render_chat


class BinaryTokenizer:
    def __init__(
        self, tokenizer_json: str, chat_template: str | None, bos_id: int | None, eos_ids: list[int],
        special_tokens: dict[str, str] | None = None,
    ):
        self.tok = Tokenizer.from_str(tokenizer_json)
        self.chat_template = chat_template
        if special_tokens is None:  # a binary from before `special_tokens` was in the meta: the ids' strings
            special_tokens = {}
            if bos_id is not None:
                special_tokens["bos_token"] = self.tok.id_to_token(bos_id)
            if eos_ids:
                special_tokens["eos_token"] = self.tok.id_to_token(eos_ids[0])
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Text for people: special tokens left out."""
        return self.tok.decode(ids, skip_special_tokens=True)

    def decode_all(self, ids: list[int]) -> str:
        """Every token's text, special tokens included: what the ids of a rendered prompt spell."""
        return self.tok.decode(ids, skip_special_tokens=False)

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return render_chat(self.chat_template, messages, self.special_tokens, add_generation_prompt)

    def chat_ids(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt))

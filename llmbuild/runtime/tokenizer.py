"""The tokenizer embedded in the binary (tokenizer.json, read by the `tokenizers` library)."""

from __future__ import annotations

from tokenizers import Tokenizer

from llmbuild.runtime.chat import render_chat


class BinaryTokenizer:
    def __init__(self, tokenizer_json: str, chat_template: str | None, bos_id: int | None, eos_ids: list[int]):
        self.tok = Tokenizer.from_str(tokenizer_json)
        self.chat_template = chat_template
        self.bos = self.tok.id_to_token(bos_id) if bos_id is not None else ""
        self.eos = self.tok.id_to_token(eos_ids[0]) if eos_ids else ""

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return self.encode(render_chat(self.chat_template, messages, self.bos or "", self.eos or ""))

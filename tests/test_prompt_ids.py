"""The end-to-end prompt of a checkpoint with a chat template, without one, and without a tokenizer
(verify/reference.py: prompt_ids_for), and what `llmbuild compile` writes about it in the recipe."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from llmbuild.recipe_types import Recipe, VerifyConfig
from llmbuild.steps.oneshot import _prompt_kind
from llmbuild.verify.reference import FIXED_PROMPT_LENGTH, prompt_ids_for, verification_ids


class _Tokenizer:
    def __init__(self, chat_template: str | None) -> None:
        self.chat_template = chat_template

    def apply_chat_template(self, messages, add_generation_prompt: bool, tokenize: bool) -> list[int]:
        assert add_generation_prompt and tokenize
        return [1, 2, *[ord(c) for c in messages[0]["content"]], 3]

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


def _recipe(**verify) -> Recipe:
    recipe = Recipe.__new__(Recipe)
    object.__setattr__(recipe, "verify", replace(VerifyConfig(), **verify))
    return recipe


def test_the_chat_template_is_applied_when_there_is_one() -> None:
    assert prompt_ids_for(_recipe(prompt="Hi"), _Tokenizer("{{ x }}"), 1000) == [1, 2, ord("H"), ord("i"), 3]


def test_plain_text_without_a_chat_template() -> None:
    assert prompt_ids_for(_recipe(prompt="Hi"), _Tokenizer(None), 1000) == [ord("H"), ord("i")]
    assert prompt_ids_for(_recipe(), _Tokenizer(""), 1000) == [ord(c) for c in "Hello"]


def test_fixed_ids_without_a_tokenizer_and_the_recipe_ids_first() -> None:
    fixed = prompt_ids_for(_recipe(), None, 1000)
    assert fixed == [int(i) for i in verification_ids(1000, FIXED_PROMPT_LENGTH)]
    assert all(0 <= i < 1000 for i in fixed)
    assert prompt_ids_for(_recipe(prompt_ids=(5, 6)), _Tokenizer("t"), 1000) == [5, 6]


def test_the_written_recipe_says_which_prompt(tmp_path: Path) -> None:
    assert "fixed token ids" in _prompt_kind(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "X"}))
    assert "plain text" in _prompt_kind(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ m }}"}))
    assert "chat template" in _prompt_kind(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("[1, 2]")  # not an object: no template, no crash
    assert "plain text" in _prompt_kind(tmp_path)

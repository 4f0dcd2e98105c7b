"""Chat templates: the checkpoint's own Jinja2 template, rendered in a sandbox (no code from data runs).

The environment is transformers' (`apply_chat_template`): the same Jinja options, globals and `tojson`
filter, and the tokenizer's special-token strings as variables, so a prompt renders to the same text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import cache
from typing import Any

from jinja2 import Template
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from llmbuild import LlmbuildError


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters; templates expect plain JSON.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Namespace(Namespace):
    """Jinja's namespace, refusing underscore names (no way to reach Python internals through it)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Jinja's own signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"chat templates cannot set underscore attributes ({name!r})")


@cache
def _compile(template: str) -> Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = dict
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(template)
    except TemplateError as exc:
        raise LlmbuildError(f"chat template: {exc}") from None


def check_chat_template(template: str) -> None:
    """Compile `template` as `render_chat` will: a template the sandbox refuses raises LlmbuildError."""
    _compile(template)


def render_chat(
    template: str | None,
    messages: list[dict[str, str]],
    special_tokens: Mapping[str, str] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text of `messages`; `special_tokens` maps bos_token, eos_token, ... to their strings."""
    if not template:
        # No template in the checkpoint: plain ChatML (docs/runtime.md says so).
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")
    try:
        return _compile(template).render(
            messages=[dict(m) for m in messages], tools=None, documents=None,
            add_generation_prompt=add_generation_prompt, **dict(special_tokens or {}),
        )
    except TemplateError as exc:
        raise LlmbuildError(f"chat template: {exc}") from None

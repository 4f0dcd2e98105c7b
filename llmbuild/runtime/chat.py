"""Chat templates: the checkpoint's own Jinja2 template, rendered in a sandbox (no code from data runs)."""

from __future__ import annotations

from datetime import datetime

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llmbuild import LlmbuildError


def _raise(message: str) -> None:
    raise LlmbuildError(f"chat template: {message}")


def render_chat(
    template: str | None, messages: list[dict[str, str]], bos: str = "", eos: str = "",
    add_generation_prompt: bool = True,
) -> str:
    if not template:
        # No template in the checkpoint: a plain ChatML rendering, said loudly in docs.
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")
    # The same environment settings transformers uses, so prompts match its apply_chat_template.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(
            messages=messages, bos_token=bos, eos_token=eos, add_generation_prompt=add_generation_prompt
        )
    except TemplateError as exc:
        raise LlmbuildError(f"chat template: {exc}") from None

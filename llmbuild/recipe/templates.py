"""Jinja templates in recipe strings, rendered in the bounded sandbox (recipe/sandbox.py): `env` reads
the environment (a missing variable is an error naming the field), `recipe` is the recipe's name.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import jinja2

from llmbuild.recipe.checkpoints import MODELS_ENV
from llmbuild.recipe.nodes import Node, located_error
from llmbuild.recipe.sandbox import BoundedSandbox


class EnvironView(Mapping[str, str]):
    """A read-only snapshot of os.environ for templates. LLMBUILD_MODELS, a folder the caller names, is read
    from where the caller stands (`LLMBUILD_MODELS=models snakemake ...` in the repository means its models/):
    left relative, the recipe's path would be taken from the recipe file's folder instead."""

    def __init__(self) -> None:
        self._vars = dict(os.environ)
        if self._vars.get(MODELS_ENV):
            self._vars[MODELS_ENV] = os.path.abspath(self._vars[MODELS_ENV])

    def __getitem__(self, key: str) -> str:
        return self._vars[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._vars)

    def __len__(self) -> int:
        return len(self._vars)


class NamedUndefined(jinja2.StrictUndefined):
    """StrictUndefined whose message is the 'expected ..., got ...' part of our error line."""

    __slots__ = ()

    @property
    def _undefined_message(self) -> str:
        if self._undefined_hint:  # the sandbox refusing an attribute: its own words say it best
            return self._undefined_hint
        if isinstance(self._undefined_obj, EnvironView):
            name = self._undefined_name
            hint = (f" (set {MODELS_ENV} to the folder holding your checkpoints, or give a default: "
                    f"{{{{ env.{MODELS_ENV} | default('/models') }}}})" if name == MODELS_ENV
                    else f" (set it, or give a default: {{{{ env.{name} | default('...') }}}})")
            return f"expected environment variable {name} to be set, got it unset{hint}"
        return f"expected a template using only env and recipe, got {super()._undefined_message}"


_TEMPLATE_MARKERS = ("{{", "{%", "{#")


def render_tree(node: Node, field: str, sandbox: BoundedSandbox, context: dict[str, Any]) -> None:
    """Render every string value in place; templates see only `env` and `recipe`."""
    if isinstance(node.value, dict):
        for key, child in node.value.items():
            render_tree(child, f"{field}.{key}" if field else key, sandbox, context)
    elif isinstance(node.value, list):
        for i, child in enumerate(node.value):
            render_tree(child, f"{field}[{i}]", sandbox, context)
    elif isinstance(node.value, str) and any(m in node.value for m in _TEMPLATE_MARKERS):
        node.value = _render(node, field, sandbox, context)


def _render(node: Node, field: str, sandbox: BoundedSandbox, context: dict[str, Any]) -> str:
    try:
        return sandbox.render_bounded(node.value, context)
    except jinja2.UndefinedError as exc:
        raise located_error(node.loc, field, str(exc)) from None
    except jinja2.sandbox.SecurityError as exc:
        raise located_error(node.loc, field, f"expected a template the sandbox allows, got {exc}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise located_error(node.loc, field, f"expected a valid Jinja2 template, got {exc.message}") from None
    except Exception as exc:  # noqa: BLE001 - any failure inside a user template is a user error
        raise located_error(node.loc, field, f"expected a template that renders, got "
                                             f"{type(exc).__name__}: {exc}") from None

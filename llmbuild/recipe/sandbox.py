"""The template engine of recipes: Jinja2's immutable sandbox, bounded so that a template cannot hang or
exhaust the machine, whatever it does.

The sandbox refuses attribute access outside a safe set but bounds nothing: `range(100000)` nested twice
runs 10^10 iterations, `'x'|center(10**9)` allocates a gigabyte. Here, for each rendering:
- every integer argument of a call or a filter, and every width in a `%` or `format` string, is at most
  MAX_OUTPUT (a recipe value is a path or a number, never megabytes);
- `*` repeats and `**` results are bounded the same way;
- `range` draws from an iteration budget shared by the whole rendering (nested loops multiply);
- the output is counted as it is produced, and the rendering stops past MAX_OUTPUT characters;
- a wall-clock limit (TIME_LIMIT_S) stops anything the bounds above miss (main thread only: signals).
Each violation is a jinja2 SecurityError, which the loader turns into a `file:line: field:` message.
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

MAX_OUTPUT = 1 << 16  # characters of a rendered value, and the largest integer argument
MAX_ITERATIONS = 100_000  # range() items over one rendering
TIME_LIMIT_S = 2.0
_DIGITS = re.compile(r"\d+")


def _check_int(value: Any, what: str) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_OUTPUT:
        raise SecurityError(f"{what} {value} too large (at most {MAX_OUTPUT})")


def _check_widths(fmt: Any) -> None:
    """A format string's field widths and precisions (`%9999999s`, `{:9999999}`) within MAX_OUTPUT."""
    if isinstance(fmt, str):
        for digits in _DIGITS.findall(fmt):
            if len(digits) > 6 or int(digits) > MAX_OUTPUT:
                raise SecurityError(f"format width {digits} too large (at most {MAX_OUTPUT})")


def _bounded_filter(name: str, fn: Callable) -> Callable:
    def run(*args: Any, **kwargs: Any) -> Any:
        for value in (*args[1:], *kwargs.values()):
            _check_int(value, f"filter {name} argument")
        if name == "format" and args:
            _check_widths(args[0])
        return fn(*args, **kwargs)

    if hasattr(fn, "jinja_pass_arg"):  # keep how Jinja passes the context or environment to the filter
        run.jinja_pass_arg = fn.jinja_pass_arg  # type: ignore[attr-defined]
    return run


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment with the bounds in the module docstring."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters = {name: _bounded_filter(name, fn) for name, fn in self.filters.items()}
        self._budget = threading.local()

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            if isinstance(left, int) and isinstance(right, int) and left.bit_length() * right > 4096:
                raise SecurityError("power too large")
            return left**right
        if operator == "%":
            _check_widths(left)
            return left % right
        for seq, n in ((left, right), (right, left)):
            repeated = isinstance(seq, str | list | tuple) and isinstance(n, int)
            if repeated and len(seq) * n > MAX_OUTPUT:
                raise SecurityError("repetition too large")
        return left * right

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (Jinja's signature)
        for value in (*args, *kwargs.values()):
            _check_int(value, "argument")
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """`str.format` and `format_map` in templates (the sandbox wraps them when they are looked up)."""
        wrapped = super().wrap_str_format(value)
        if wrapped is not None:
            _check_widths(value.__self__)
        return wrapped

    def _range(self, *args: int) -> range:
        r = range(*args)
        self._budget.left -= len(r)
        if self._budget.left < 0:
            raise SecurityError(f"more than {MAX_ITERATIONS} loop iterations")
        return r

    def render_bounded(self, source: str, context: dict[str, Any]) -> str:
        """`source` rendered with `context`, within the bounds."""
        self._budget.left = MAX_ITERATIONS
        template = self.from_string(source)
        out, size = [], 0
        with _time_limit(TIME_LIMIT_S):
            for chunk in template.generate({**context, "range": self._range}):
                size += len(chunk)
                if size > MAX_OUTPUT:
                    raise SecurityError(f"output longer than {MAX_OUTPUT} characters")
                out.append(chunk)
        return "".join(out)


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise SecurityError in the main thread after `seconds` (elsewhere: no limit, the other bounds hold)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise SecurityError(f"took longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

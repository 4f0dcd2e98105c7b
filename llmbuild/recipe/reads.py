"""A recipe seen through a record of the fields a step reads.

A build step's rerun digest covers the recipe fields its descriptor declares (llmbuild/steps/descriptors.py);
a field the step reads without declaring it would leave the step stale when that field changes. Each step
therefore sees its recipe through `watch(recipe, allowed)`: every field read is recorded by its dotted path
(`quantization.mode`, `verify.prompt`; a mapping field such as `source.config` as a whole), and with
`LLMBUILD_STRICT_READS=1` (the tests set it) a read outside `allowed` fails at once, naming the field.

The view is the recipe's own classes, not a wrapper: each object is a shallow copy whose class is a
subclass of its own that records attribute reads, so `isinstance`, `dataclasses.replace`, `asdict` and
equality behave as on the plain recipe. `recipe.raw` is a mapping that records its keys the same way.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable, Iterable
from functools import cache
from typing import Any

from llmbuild import LlmbuildError

STRICT_ENV = "LLMBUILD_STRICT_READS"
# Recipe attributes that are not fields of the schema: its identity and where it lives.
IDENTITY = frozenset({"name", "path", "raw"})


class UndeclaredRead(LlmbuildError):
    """A step read a recipe field its descriptor does not declare (only raised in strict mode)."""


@dataclasses.dataclass
class ReadLog:
    """The fields read through one view, and what the step may read."""

    step: str
    allowed: Callable[[str], bool]
    strict: bool
    fields: set[str] = dataclasses.field(default_factory=set)

    def read(self, path: str) -> None:
        if path in self.fields:
            return
        if self.strict and not self.allowed(path):
            raise UndeclaredRead(
                f"step {self.step} read recipe field {path}, which its descriptor (llmbuild/steps/descriptors.py) "
                "does not declare: a change of that field would not rerun it")
        self.fields.add(path)


def watch(recipe: Any, step: str, allowed: Callable[[str], bool], strict: bool | None = None) -> tuple[Any, ReadLog]:
    """(a view of `recipe` recording every field read, the log it records into)."""
    if strict is None:
        strict = os.environ.get(STRICT_ENV) == "1"
    log = ReadLog(step, allowed, strict)
    return _view(recipe, "", log), log


def _view(value: Any, prefix: str, log: ReadLog) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        view = copy.copy(value)
        object.__setattr__(view, "__class__", _recording_class(type(value)))
        object.__setattr__(view, "_reads_prefix", prefix)
        object.__setattr__(view, "_reads_log", log)
        return view
    return value


@cache
def _recording_class(cls: type) -> type:
    names = frozenset(f.name for f in dataclasses.fields(cls))

    def __getattribute__(self, name: str) -> Any:  # noqa: N807 - the hook's own name
        value = object.__getattribute__(self, name)
        if name not in names:
            return value
        state = object.__getattribute__(self, "__dict__")
        log = state.get("_reads_log")
        if log is None:  # made by dataclasses.replace from a view: a plain copy
            return value
        prefix = state["_reads_prefix"]
        if not prefix and name in IDENTITY:
            return RecordingDict(value, "", log) if name == "raw" else value
        path = f"{prefix}{name}"
        if dataclasses.is_dataclass(value):
            return _view(value, f"{path}.", log)  # a section: its fields are recorded one by one
        log.read(path)
        return value

    def __reduce_ex__(self, _protocol: int):  # noqa: N807 - pickled or deep-copied: the plain object, read whole
        state = dict(object.__getattribute__(self, "__dict__"))
        log, prefix = state.pop("_reads_log", None), state.pop("_reads_prefix", "")
        if log is not None:
            log.read(f"{prefix}*")
        return plain, (cls, state)

    hooks = {"__getattribute__": __getattribute__, "__reduce_ex__": __reduce_ex__}
    return type(f"Watched{cls.__name__}", (cls,), hooks)


def plain(cls: type, state: dict[str, Any]) -> Any:
    plain = object.__new__(cls)
    object.__getattribute__(plain, "__dict__").update(state)
    return plain


class RecordingDict(dict):
    """`recipe.raw` (or one of its sections): a key read records `prefix.key` when its value is a field,
    and descends when it is a section; reading the mapping whole (iteration, items, len) records it whole."""

    def __init__(self, data: dict[str, Any], prefix: str, log: ReadLog) -> None:
        super().__init__(data)
        self._prefix, self._log = prefix, log

    def _child(self, key: str, value: Any) -> Any:
        path = f"{self._prefix}{key}"
        if isinstance(value, dict) and not self._prefix and key in _SECTIONS:
            return RecordingDict(value, f"{path}.", self._log)
        self._log.read(path)
        return value

    def __getitem__(self, key: str) -> Any:
        return self._child(key, super().__getitem__(key))

    def get(self, key: str, default: Any = None) -> Any:
        return self._child(key, super().get(key, default)) if key in self else default

    def _whole(self) -> None:
        self._log.read(f"{self._prefix}*")

    def __iter__(self):
        self._whole()
        return super().__iter__()

    def items(self):
        self._whole()
        return super().items()

    def values(self):
        self._whole()
        return super().values()

    def __len__(self) -> int:
        self._whole()
        return super().__len__()


# The schema's sections: reading raw["verify"] descends into verify's fields instead of reading it whole.
_SECTIONS = frozenset({"source", "quantization", "target", "stages", "vision", "bmodel", "verify"})


def covers(declared: Iterable[str]) -> Callable[[str], bool]:
    """Whether a read falls under the declared fields: `quantization` covers `quantization.mode`, and
    `quantization.checkpoint` covers `quantization.checkpoint.bits`; reading an absent section (`vision` of a
    text model is None) is covered by any declared field inside it, whose value its absence decides. A
    section read whole (`verify.*`) needs the section declared, the whole recipe (`*`) everything."""
    fields = frozenset(declared)

    def allowed(path: str) -> bool:
        if "*" in fields:
            return True
        parts = path.split(".")
        if any(".".join(parts[:i]) in fields for i in range(1, len(parts))):
            return True
        if parts[-1] == "*":
            return False
        return path in fields or any(f.startswith(f"{path}.") for f in fields)

    return allowed

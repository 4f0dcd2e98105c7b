"""The known model families, text and vision-language alike: one line each, name -> its kind and its folder,
whose modules are imported on first use. Shared phase packages find a family here by its name (a spec's
`architecture`, a recipe's `vision.family`, a config.json's `model_type`, a GGUF file's
`general.architecture`), never by importing its folder.

A family folder holds modules at different layers, named by role (`family`, `checkpoint`, `synthetic`,
`runtime`, `model`, `reference`, `stream`, `verify`, `cost`, `vendor`: pyproject.toml's contracts place each); a phase
package reaches one through `family_part`, imported on first use, so that it never imports the folder itself.
A text family's `family` module exports `FAMILY` (a `Family`: `get_family`); a vision-language family's
describes its tower, projector and images with module-level names and hooks, and its language model is a
text family's.

Families outside the package (a test's, a user's) join through `register_family`.
"""

from __future__ import annotations

import importlib
import importlib.util
from functools import cache
from types import ModuleType
from typing import NamedTuple

from llmbuild import ConfigFieldError, LlmbuildError
from llmbuild.families.family import Family

TEXT = "text"  # a decoder: a recipe's `architecture`
VISION_LANGUAGE = "vision-language"  # a tower and projector before a text family's decoder: `vision.family`
KINDS = (TEXT, VISION_LANGUAGE)


class Entry(NamedTuple):
    kind: str  # one of KINDS
    folder: str  # the family folder's package; its `family` module describes the family


# Registry name -> its entry. Sorted; `register_family` adds to it.
FAMILIES: dict[str, Entry] = {
    "internvl": Entry(VISION_LANGUAGE, "llmbuild.families.internvl"),
    "llama": Entry(TEXT, "llmbuild.families.llama"),
    "minicpmv": Entry(VISION_LANGUAGE, "llmbuild.families.minicpmv"),
    "minicpmv4_6": Entry(VISION_LANGUAGE, "llmbuild.families.minicpmv4_6"),
    "qwen2": Entry(TEXT, "llmbuild.families.qwen2"),
    "qwen3": Entry(TEXT, "llmbuild.families.qwen3"),
    "qwen3_5": Entry(TEXT, "llmbuild.families.qwen3_5"),
}


def register_family(name: str, module: str, kind: str = TEXT) -> None:
    """Make the family whose folder's `family` module is `module` (an importable module name ending in
    `.family`; a text family's exports FAMILY) known as `name`. Registering a name again with another
    folder is an error: two families cannot answer to one name."""
    folder, _, leaf = module.rpartition(".")
    if leaf != "family" or not folder:
        raise LlmbuildError(f"family {name!r}: expected the `family` module of a family folder, got {module!r}")
    if kind not in KINDS:
        raise LlmbuildError(f"family {name!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
    known = FAMILIES.get(name)
    if known is not None and known != (kind, folder):
        raise LlmbuildError(f"family {name!r} is already registered (by {known.folder}.family)")
    FAMILIES[name] = Entry(kind, folder)
    get_family.cache_clear()


def unregister_family(name: str) -> None:
    """Forget a family `register_family` added (a test's, when it ends)."""
    FAMILIES.pop(name, None)
    get_family.cache_clear()


def known_families(kind: str = TEXT) -> list[str]:
    """The registered families of `kind`, sorted (text: the architectures a recipe may name)."""
    return sorted(name for name, entry in FAMILIES.items() if entry.kind == kind)


@cache
def get_family(name: str) -> Family:
    """A text family's description (its `family` module's FAMILY)."""
    entry = FAMILIES.get(name)
    if entry is None or entry.kind != TEXT:
        raise LlmbuildError(f"unknown architecture {name!r}: expected one of {', '.join(known_families())}")
    module = f"{entry.folder}.family"
    family = importlib.import_module(module).FAMILY
    if family.name != name:
        raise LlmbuildError(f"{module}: FAMILY is named {family.name!r}, registered as {name!r}")
    return family


@cache
def text_tensor_prefixes() -> dict[str, str]:
    """Every registered family's prefixes of a language model stored under another name than `model.` (a
    vision-language upload's) -> the prefix its lm_head is stored under."""
    found: dict[str, str] = {}
    for name in known_families():
        found.update(get_family(name).text_prefixes)
    for name in known_families(VISION_LANGUAGE):
        found.update(getattr(family_part(name, "family"), "TEXT_PREFIXES", {}))
    return found


def text_family_for_hf_model_type(model_type: object) -> str | None:
    """The text family that reads a config.json of this `model_type`, or None."""
    for name in known_families():
        if model_type in get_family(name).hf_model_types:
            return name
    return None


def family_for_hf_model_type(model_type: str, origin: str = "") -> str:
    """The text family's name for a config.json `model_type`; `origin` (the file) starts the error message."""
    name = text_family_for_hf_model_type(model_type)
    if name is not None:
        return name
    known = sorted(t for n in known_families() for t in get_family(n).hf_model_types)
    where = f"{origin}: model_type: " if origin else ""
    raise ConfigFieldError(f"{where}unsupported model_type {model_type!r}: expected one of {', '.join(known)}",
                           "model_type")


def family_for_gguf(gguf_architecture: str) -> str:
    """The text family's name for a GGUF `general.architecture` value."""
    for name in known_families():
        if gguf_architecture in get_family(name).gguf_architectures:
            return name
    known = sorted(a for n in known_families() for a in get_family(n).gguf_architectures)
    raise LlmbuildError(f"unsupported GGUF architecture {gguf_architecture!r}: expected one of {', '.join(known)}")


def family_part(name: str, role: str) -> ModuleType:
    """The module of family `name`'s folder that plays `role` (e.g. "runtime": `<folder>/runtime.py`),
    imported now."""
    entry = FAMILIES.get(name)
    if entry is None:
        raise LlmbuildError(f"unknown model family {name!r}: expected one of {', '.join(sorted(FAMILIES))}")
    return importlib.import_module(f"{entry.folder}.{role}")


def family_part_if_any(name: str, role: str) -> ModuleType | None:
    """`family_part`, or None where family `name` is not registered or its folder has no such module (a role
    only some families have: a text family has no `runtime`; InternVL's checkpoint has no `checkpoint` check
    of its own)."""
    entry = FAMILIES.get(name)
    if entry is None:
        return None
    module = f"{entry.folder}.{role}"
    return importlib.import_module(module) if importlib.util.find_spec(module) is not None else None


def vision_family_for_hf_model_type(model_type: object) -> str | None:
    """The vision-language family whose folder reads a config.json of this `model_type` (its `family`
    module's HF_MODEL_TYPES), or None."""
    for name in known_families(VISION_LANGUAGE):
        if model_type in family_part(name, "family").HF_MODEL_TYPES:
            return name
    return None

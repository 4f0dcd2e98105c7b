"""The known model families: one line each, name -> the module whose `FAMILY` describes it, imported on
first use. Shared phase packages find a family here by its name (a spec's `architecture`, a config.json's
`model_type`, a GGUF file's `general.architecture`), never by importing its folder.

Families outside the package (a test's, a user's) join through `register_family`.

A family folder holds modules at different layers, named by role (`family`, `checkpoint`, `synthetic`,
`runtime`, `model`, `reference`, `verify`, `cost`: pyproject.toml's contracts place each); a phase package
reaches one through `family_part`, imported on first use, so that it never imports the folder itself.
Vision-language families (a recipe's `vision.family`) are listed apart: their language model is a text
family's, and their folder's `family` module describes the rest.
"""

from __future__ import annotations

import importlib
import importlib.util
from functools import cache
from types import ModuleType

from llmbuild import ConfigFieldError, LlmbuildError
from llmbuild.families.family import Family

# Registry name -> the module whose FAMILY implements it. Sorted; `register_family` adds to it.
FAMILIES: dict[str, str] = {
    "llama": "llmbuild.families.llama.family",
    "qwen2": "llmbuild.families.qwen2.family",
    "qwen3": "llmbuild.families.qwen3.family",
    "qwen3_5": "llmbuild.families.qwen3_5.family",
}


# Vision-language family (a recipe's vision.family) -> its folder's package. Sorted.
VISION_FAMILIES: dict[str, str] = {
    "minicpmv": "llmbuild.families.minicpmv",
    "minicpmv4_6": "llmbuild.families.minicpmv4_6",
}


def register_family(name: str, module: str) -> None:
    """Make the family that `module` (an importable module name exporting FAMILY) describes known as `name`.
    Registering a name again with another module is an error: two families cannot answer to one name."""
    known = FAMILIES.get(name)
    if known is not None and known != module:
        raise LlmbuildError(f"family {name!r} is already registered (by {known})")
    FAMILIES[name] = module
    get_family.cache_clear()


def unregister_family(name: str) -> None:
    """Forget a family `register_family` added (a test's, when it ends)."""
    FAMILIES.pop(name, None)
    get_family.cache_clear()


def known_families() -> list[str]:
    return sorted(FAMILIES)


@cache
def get_family(name: str) -> Family:
    module = FAMILIES.get(name)
    if module is None:
        raise LlmbuildError(f"unknown architecture {name!r}: expected one of {', '.join(known_families())}")
    family = importlib.import_module(module).FAMILY
    if family.name != name:
        raise LlmbuildError(f"{module}: FAMILY is named {family.name!r}, registered as {name!r}")
    return family


def family_for_hf_model_type(model_type: str, origin: str = "") -> str:
    """The registry name for a config.json `model_type`; `origin` (the file) starts the error message."""
    for name in known_families():
        if model_type in get_family(name).hf_model_types:
            return name
    known = sorted(t for n in known_families() for t in get_family(n).hf_model_types)
    where = f"{origin}: model_type: " if origin else ""
    raise ConfigFieldError(f"{where}unsupported model_type {model_type!r}: expected one of {', '.join(known)}",
                           "model_type")


def family_for_gguf(gguf_architecture: str) -> str:
    """The registry name for a GGUF `general.architecture` value."""
    for name in known_families():
        if gguf_architecture in get_family(name).gguf_architectures:
            return name
    known = sorted(a for n in known_families() for a in get_family(n).gguf_architectures)
    raise LlmbuildError(f"unsupported GGUF architecture {gguf_architecture!r}: expected one of {', '.join(known)}")


def known_vision_families() -> list[str]:
    return sorted(VISION_FAMILIES)


def _package(name: str) -> str:
    if name in VISION_FAMILIES:
        return VISION_FAMILIES[name]
    if name in FAMILIES:
        return FAMILIES[name].rpartition(".")[0]
    known = ", ".join(known_families() + known_vision_families())
    raise LlmbuildError(f"unknown model family {name!r}: expected one of {known}")


def family_part(name: str, role: str) -> ModuleType:
    """The module of family `name`'s folder that plays `role` (e.g. "runtime": `<folder>/runtime.py`),
    imported now."""
    return importlib.import_module(f"{_package(name)}.{role}")


def family_part_if_any(name: str, role: str) -> ModuleType | None:
    """`family_part`, or None where family `name` has no folder here or its folder no such module (InternVL,
    whose vision machinery is still the shared one, gives None)."""
    if name not in VISION_FAMILIES and name not in FAMILIES:
        return None
    module = f"{_package(name)}.{role}"
    return importlib.import_module(module) if importlib.util.find_spec(module) is not None else None


def vision_family_for_hf_model_type(model_type: object) -> str | None:
    """The vision-language family whose folder reads a config.json of this `model_type` (its `family`
    module's HF_MODEL_TYPES), or None."""
    for name in known_vision_families():
        if model_type in family_part(name, "family").HF_MODEL_TYPES:
            return name
    return None

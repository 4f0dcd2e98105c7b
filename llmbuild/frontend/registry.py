"""The known decoder families. Adding one is a module under `arch/` plus one line here."""

from __future__ import annotations

import importlib
from functools import cache

from llmbuild import ConfigFieldError, LlmbuildError
from llmbuild.frontend.arch.base import Architecture

# Registry name -> the module whose ARCHITECTURE implements it (imported on first use). Sorted.
ARCHITECTURES: dict[str, str] = {
    "llama": "llmbuild.frontend.arch.llama",
    "qwen2": "llmbuild.frontend.arch.qwen2",
    "qwen3": "llmbuild.frontend.arch.qwen3",
}


def known_architectures() -> list[str]:
    return sorted(ARCHITECTURES)


@cache
def get_architecture(name: str) -> Architecture:
    module = ARCHITECTURES.get(name)
    if module is None:
        raise LlmbuildError(f"unknown architecture {name!r}: expected one of {', '.join(known_architectures())}")
    return importlib.import_module(module).ARCHITECTURE


def architecture_for_hf_model_type(model_type: str, origin: str = "") -> str:
    """The registry name for a config.json `model_type`; `origin` (the file) starts the error message."""
    for name in known_architectures():
        if model_type in get_architecture(name).hf_model_types:
            return name
    known = sorted(t for n in known_architectures() for t in get_architecture(n).hf_model_types)
    where = f"{origin}: model_type: " if origin else ""
    raise ConfigFieldError(f"{where}unsupported model_type {model_type!r}: expected one of {', '.join(known)}",
                           "model_type")


def architecture_for_gguf(gguf_architecture: str) -> str:
    """The registry name for a GGUF `general.architecture` value."""
    for name in known_architectures():
        if gguf_architecture in get_architecture(name).gguf_architectures:
            return name
    known = sorted(a for n in known_architectures() for a in get_architecture(n).gguf_architectures)
    raise LlmbuildError(f"unsupported GGUF architecture {gguf_architecture!r}: expected one of {', '.join(known)}")

"""The decoder families under the frontend's names: llmbuild/families/registry.py is the registry; these
are its functions as the checkpoint readers and the recipe schema have always called them."""

from __future__ import annotations

from llmbuild.families.registry import FAMILIES as ARCHITECTURES
from llmbuild.families.registry import family_for_gguf as architecture_for_gguf
from llmbuild.families.registry import family_for_hf_model_type as architecture_for_hf_model_type
from llmbuild.families.registry import get_family as get_architecture
from llmbuild.families.registry import known_families as known_architectures

__all__ = ["ARCHITECTURES", "architecture_for_gguf", "architecture_for_hf_model_type", "get_architecture",
           "known_architectures"]

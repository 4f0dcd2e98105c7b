"""A recipe source's `ModelSpec` from its configuration alone: no tensor is read, so it is cheap for any
model size and works without the weights (an hf recipe's shipped `source.config_file`).

Used by `llmbuild estimate` and the fit check at the start of a build.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from llmbuild import LlmbuildError
from llmbuild.families.spec import ModelSpec

if TYPE_CHECKING:
    from llmbuild.recipe_types import SourceConfig


def spec_from_hf_config_file(path: Path) -> ModelSpec:
    """The ModelSpec a Hugging Face config.json describes (its model_type picks the architecture)."""
    from llmbuild.families.registry import family_for_hf_model_type, get_family
    from llmbuild.frontend.hf import read_json, text_config

    path = Path(path)
    cfg = text_config(read_json(path))  # a vision-language config's language model
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        raise LlmbuildError(f"{path}: missing field 'model_type'")
    arch = get_family(family_for_hf_model_type(model_type, str(path)))
    return arch.spec_from_hf_config(cfg, origin=str(path))


def architecture_without_weights(source: SourceConfig) -> str:
    """The registry architecture a recipe's source names (its model_type or the GGUF's architecture), from
    configuration or file headers only."""
    from llmbuild.families.registry import family_for_gguf, family_for_hf_model_type

    if source.kind == "synthetic":
        return family_for_hf_model_type((source.config or {}).get("model_type", ""))
    if source.kind == "gguf":
        from llmbuild.frontend.gguf_source import open_gguf
        from llmbuild.frontend.sources import gguf_file

        return family_for_gguf(str(open_gguf(gguf_file(source))[1].get("general.architecture")))
    from llmbuild.frontend.hf import read_json, text_config

    path = Path(source.path) / "config.json" if source.path and (Path(source.path) / "config.json").is_file() \
        else Path(source.config_file or "")
    return family_for_hf_model_type(str(text_config(read_json(path)).get("model_type")))


def spec_without_weights(source: SourceConfig) -> ModelSpec:
    """The ModelSpec of a recipe's source, read from configuration or file headers only."""
    if source.kind == "synthetic":
        from llmbuild.families.registry import family_for_hf_model_type, get_family
        from llmbuild.frontend.synthetic import full_hf_config

        cfg = full_hf_config(source.config or {})
        arch = get_family(family_for_hf_model_type(cfg["model_type"]))
        return arch.spec_from_hf_config(cfg, origin="source.config")
    if source.kind == "hf":
        # The checkpoint's own config wins; the shipped copy stands in while the checkpoint is absent.
        if source.path and (Path(source.path) / "config.json").is_file():
            return spec_from_hf_config_file(Path(source.path) / "config.json")
        if source.config_file:
            return spec_from_hf_config_file(Path(source.config_file))
        raise LlmbuildError(f"source.path: no config.json in {source.path} and no source.config_file")
    if source.kind == "gguf":
        from llmbuild.families.registry import family_for_gguf, get_family
        from llmbuild.frontend.gguf_source import open_gguf
        from llmbuild.frontend.sources import gguf_file

        path = gguf_file(source)
        index, metadata = open_gguf(path)
        arch_name = metadata.get("general.architecture")
        if not isinstance(arch_name, str):
            raise LlmbuildError(f"{path}: missing metadata general.architecture")
        arch = get_family(family_for_gguf(arch_name))
        return arch.spec_from_gguf(metadata, [t.name for t in index.tensors], origin=str(path))
    raise LlmbuildError(f"source: unknown kind {source.kind!r}: expected synthetic, hf or gguf")

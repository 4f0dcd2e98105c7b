"""`llmbuild prepare RECIPE`: the checkpoint the build reads and the model spec."""

from __future__ import annotations

import shutil
from pathlib import Path

from llmbuild import LlmbuildError, one_line
from llmbuild.artifacts.paths import BuildPaths, write_spec
from llmbuild.families.layout import layer_tensor_names
from llmbuild.families.registry import family_part, family_part_if_any
from llmbuild.families.spec import ModelSpec
from llmbuild.frontend.checkpoint_scan import scan_checkpoint, scan_gguf
from llmbuild.frontend.gguf_source import GGUFSource
from llmbuild.frontend.hf import HFSource
from llmbuild.frontend.sources import open_source, prepare_checkpoint
from llmbuild.quant.checkpoint import QuantizedCheckpoint
from llmbuild.quant.scheme import layer_projections
from llmbuild.recipe_types import Recipe


def prepare(recipe: Recipe) -> None:
    paths = BuildPaths.of(recipe)
    created = not paths.root.exists()
    paths.root.mkdir(parents=True, exist_ok=True)
    try:
        _prepare(recipe, paths)
    except BaseException:
        # A refused checkpoint leaves nothing that reads as prepared: not its pointer, not an old spec.
        shutil.rmtree(paths.checkpoint, ignore_errors=True)
        paths.spec.unlink(missing_ok=True)
        if created and not any(paths.root.iterdir()):
            paths.root.rmdir()
        raise


def _prepare(recipe: Recipe, paths: BuildPaths) -> None:
    if recipe.vision is not None and recipe.source.kind == "gguf":
        raise LlmbuildError(f"{recipe.path}: vision: a vision-language model from a GGUF file is not supported "
                            "(give its Hugging Face directory, source.kind hf)")
    vision = recipe.vision.config if recipe.vision else None
    if vision is not None:
        # The synthetic writer picks the family folder's layout by the config's model_type.
        vision = {**vision, "model_type": family_part(recipe.vision.family, "family").HF_MODEL_TYPES[0]}
    prepare_checkpoint(recipe.source, paths.checkpoint, vision)
    source = open_source(recipe.source, paths.checkpoint)
    if isinstance(source, HFSource):
        # Before any step reads it: every tensor present with its shape, every float value finite, and
        # a quantized checkpoint's packed tensors consistent with its quantization_config.
        packed = _imported_projections(recipe, source.spec)
        scan_checkpoint(source, frozenset(f"{name}.weight" for name in packed))
        if packed:
            checkpoint = QuantizedCheckpoint(source.directory)
            for name in packed:
                checkpoint.check_linear(f"model.{name}")
        own = family_part_if_any(recipe.vision.family, "checkpoint") if recipe.vision is not None else None
        if recipe.source.kind == "hf" and own is not None:
            own.check_vision_tensors(source.directory, source.entries())  # the vision step reads them next
    elif isinstance(source, GGUFSource):
        source.check_entries()
        scan_gguf(source.path, source.raw_tensors())
    _check_tokenizer(paths.checkpoint)
    write_spec(source.spec, paths.spec)


def _check_tokenizer(checkpoint: Path) -> None:
    """The tokenizer files parse and the chat template compiles, now, rather than in the reference or link
    step; a checkpoint without a tokenizer is built with fixed prompt ids (verify/reference.py)."""
    from tokenizers import Tokenizer

    from llmbuild.frontend.tokenizer_files import read_tokenizer_bundle, tokenizer_directory
    from llmbuild.runtime.chat import check_chat_template

    where = tokenizer_directory(checkpoint)
    if not (where / "tokenizer.json").is_file():
        return
    bundle = read_tokenizer_bundle(checkpoint)
    try:
        Tokenizer.from_str(bundle.tokenizer_json)
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises its own exception types
        raise LlmbuildError(f"{where / 'tokenizer.json'}: cannot read the tokenizer: "
                            f"{one_line(str(exc))[:160]}") from None
    if bundle.chat_template:
        try:
            check_chat_template(bundle.chat_template)
        except LlmbuildError as exc:
            raise LlmbuildError(f"{where}: chat_template: expected a template that compiles, got "
                                f"{str(exc).removeprefix('chat template: ')}") from None


def _imported_projections(recipe: Recipe, spec: ModelSpec) -> tuple[str, ...]:
    """The projections a quantized checkpoint stores packed, by canonical name (`layers.0.mlp.up_proj`)."""
    if recipe.quantization.origin != "checkpoint":
        return ()
    return tuple(f"layers.{i}.{proj}" for i in range(spec.num_layers)
                 for proj in layer_projections(layer_tensor_names(spec, i), i))

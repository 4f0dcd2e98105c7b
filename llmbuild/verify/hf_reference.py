"""The independent reference: transformers itself, on the same checkpoint, in float32.

torch and transformers are imported inside the function: they are heavy, and only verification
needs them (they come with the `reference` extra).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmbuild import LlmbuildError

if TYPE_CHECKING:
    from llmbuild.recipe.schema import SourceConfig


def load_reference_model(source: SourceConfig, checkpoint_dir: Path) -> tuple[Any, Any]:
    """(model, tokenizer) from transformers: float32, eval mode, never touching the network.

    synthetic: the checkpoint directory we wrote; hf: the source directory; gguf: transformers'
    own GGUF loader on the original file (dequantized, q/k permutation undone by transformers),
    with the tokenizer it builds itself, so neither depends on our readers.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise LlmbuildError(
            f"verification needs torch and transformers ({exc.name} is missing): install torch==2.13.0 "
            "first (see README), then `pip install 'llmbuild[reference]'`"
        ) from None

    kwargs: dict[str, Any] = {"local_files_only": True}
    if source.kind == "synthetic":
        location = Path(checkpoint_dir)
    elif source.kind == "hf":
        if not source.path:
            raise LlmbuildError("source: an hf source needs 'path' (a checkpoint directory)")
        location = Path(source.path)
    elif source.kind == "gguf":
        from llmbuild.frontend import gguf_file

        path = gguf_file(source)
        try:
            import accelerate  # noqa: F401  (transformers refuses GGUF files without it)
        except ImportError:
            raise LlmbuildError(
                "loading a GGUF reference model with transformers needs accelerate: pip install accelerate"
            ) from None
        location, kwargs["gguf_file"] = path.parent, path.name
    else:
        raise LlmbuildError(f"source: unknown kind {source.kind!r}: expected synthetic, hf or gguf")

    model = transformers.AutoModelForCausalLM.from_pretrained(location, dtype=torch.float32, **kwargs)
    tokenizer = transformers.AutoTokenizer.from_pretrained(location, **kwargs)
    return model.eval(), tokenizer

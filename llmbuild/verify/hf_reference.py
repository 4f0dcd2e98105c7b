"""transformers' whole models, in float32: what the streamed reference (reference.py) is checked against
(tests/test_reference_stream.py), and what benchmarks and frontend tests compare with.

torch and transformers are imported inside the functions: they are heavy, and only verification
needs them (they come with the `reference` extra).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmbuild import LlmbuildError

if TYPE_CHECKING:
    from llmbuild.recipe_types import SourceConfig


def require_reference_libraries() -> None:
    """A one-line error naming what to install when torch or transformers is missing."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise LlmbuildError(
            f"verification needs torch and transformers ({exc.name} is missing): install torch==2.13.0 "
            "first (see README), then `pip install 'llmbuild[reference]'`"
        ) from None


def load_reference_model(source: SourceConfig, checkpoint_dir: Path) -> tuple[Any, Any]:
    """(model, tokenizer) from transformers: float32, eval mode, never touching the network.

    synthetic: the checkpoint directory we wrote; hf: the source directory; gguf: transformers'
    own GGUF loader on the original file (dequantized, q/k permutation undone by transformers),
    with the tokenizer it builds itself, so neither depends on our readers.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    require_reference_libraries()
    import torch
    import transformers

    kwargs: dict[str, Any] = {"local_files_only": True}
    if source.kind == "synthetic":
        location = Path(checkpoint_dir)
    elif source.kind == "hf":
        if not source.path:
            raise LlmbuildError("source: an hf source needs 'path' (a checkpoint directory)")
        location = Path(source.path)
    elif source.kind == "gguf":
        from llmbuild.frontend.sources import gguf_file

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


def load_dequantized_model(checkpoint_dir: Path, tokenizer_dir: Path) -> tuple[Any, Any]:
    """(model, tokenizer or None): transformers' float32 model of a quantized checkpoint's architecture,
    its projections set to the checkpoint's dequantized weights and every other tensor as stored.

    transformers would otherwise hand a GPTQ/AWQ checkpoint to a quantization backend (CUDA kernels, or
    libraries the build does not need); the reference is the float model those weights mean. The
    dequantization (llmbuild.quant) is checked bit for bit against each writing library's own code in
    tests/test_quant_formats.py."""
    import json

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    import torch
    import transformers

    from llmbuild.quant.checkpoint import QuantizedCheckpoint

    checkpoint = QuantizedCheckpoint(Path(checkpoint_dir))
    fields = json.loads((Path(checkpoint_dir) / "config.json").read_text(encoding="utf-8"))
    fields.pop("quantization_config", None)
    config = transformers.AutoConfig.for_model(**fields)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    wanted = model.state_dict()
    tensors: dict[str, Any] = {}
    for prefix in checkpoint.linear_prefixes():
        tensors[prefix + ".weight"] = torch.from_numpy(checkpoint.linear(prefix).dequantize())
    reader = checkpoint.tensors
    for name in reader.names():
        if name in wanted and name not in tensors and reader.dtype(name).startswith(("F", "BF")):
            tensors[name] = torch.from_numpy(np.asarray(reader.read(name), dtype=np.float32))
    missing = set(wanted) - set(tensors)
    if config.tie_word_embeddings:
        missing.discard("lm_head.weight")
    if missing:
        raise LlmbuildError(f"{checkpoint_dir}: missing tensor {sorted(missing)[0]!r} for the reference model")
    model.load_state_dict(tensors, strict=False)
    model.tie_weights()
    tokenizer = None
    if (Path(tokenizer_dir) / "tokenizer.json").is_file() or (Path(tokenizer_dir) / "tokenizer_config.json").is_file():
        tokenizer = transformers.AutoTokenizer.from_pretrained(Path(tokenizer_dir), local_files_only=True)
    return model.eval(), tokenizer

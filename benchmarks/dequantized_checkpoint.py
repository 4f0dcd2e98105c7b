"""The weights a recipe builds from, written as a bf16 Hugging Face checkpoint directory, one layer at a time.

For a quantized checkpoint that llama.cpp's GGUF converter cannot read (AWQ, 3-bit GPTQ): the dequantized levels
the reference and transformers_decode.py read (`reference_weights`), so llama.cpp gets the same weights. One
safetensors file per decoder layer and one for the embedding, final norm and lm_head; at most one layer's
float32 weights (or one block of embedding rows) exist at once. The config is the checkpoint's without its
quantization_config; the tokenizer files are the recipe's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "generation_config.json", "chat_template.jinja")
ROWS = 8192  # embedding and lm_head rows read at once


def write_dequantized(recipe_name: str, out: Path) -> Path:
    """The recipe's weights as a bf16 checkpoint directory at `out` (replaced; written whole or not at all)."""
    import torch
    import transformers
    from safetensors.torch import save_file

    from llmbuild.artifacts.paths import BuildPaths, tokenizer_dir
    from llmbuild.recipe import load_recipe
    from llmbuild.verify.reference import reference_weights

    recipe = load_recipe(recipe_name)
    paths = BuildPaths.of(recipe)
    weights = reference_weights(recipe, paths)
    config = weights.config
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    index: dict[str, str] = {}

    def save(tensors: dict[str, torch.Tensor], file: str) -> None:
        save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, str(partial / file))
        index.update(dict.fromkeys(tensors, file))

    for i, layer in enumerate(model.get_decoder().layers):
        state = weights.layer(i, list(layer.state_dict()))
        save({f"model.layers.{i}.{k}": v for k, v in state.items()}, f"layer-{i:05d}.safetensors")
        del state
    embed, head = vocabulary_tables(weights)
    outer = {"model.embed_tokens.weight": embed, "model.norm.weight": weights.norm()}
    if head is not None:
        outer["lm_head.weight"] = head
    save(outer, "outer.safetensors")

    fields = config.to_dict()
    fields.pop("quantization_config", None)
    fields["torch_dtype"] = fields["dtype"] = "bfloat16"
    (partial / "config.json").write_text(json.dumps(fields, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (partial / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": dict(sorted(index.items()))}, indent=2) + "\n", encoding="utf-8")
    source = tokenizer_dir(recipe, paths)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, partial / name)
    shutil.rmtree(out, ignore_errors=True)
    partial.replace(out)
    return out


def vocabulary_tables(weights: Any) -> tuple[Any, Any]:
    """(embedding, lm_head or None when tied) in bf16, read ROWS rows at a time: no float32 copy of a whole
    vocabulary table exists at once."""
    import torch

    config = weights.config
    embed = torch.empty(config.vocab_size, config.hidden_size, dtype=torch.bfloat16)
    head = None if config.tie_word_embeddings else torch.empty_like(embed)
    for lo in range(0, config.vocab_size, ROWS):
        hi = min(config.vocab_size, lo + ROWS)
        embed[lo:hi] = weights.embedding_rows(list(range(lo, hi)))
        if head is not None:
            head[lo:hi] = weights.head_rows(lo, hi)
    return embed, head

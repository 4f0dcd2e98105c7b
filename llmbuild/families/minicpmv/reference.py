"""MiniCPM-V 2.6 whole, in torch: the reference model llmbuild checks against. The vision path is
`model.reference_features` (transformers' tower, the published resampler, each slice at its own size); the
language model is transformers' Qwen2ForCausalLM with the checkpoint's `llm.*` tensors, whose embeddings at
the `<unk>` placeholder rows are replaced by the resampler's rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.families.minicpmv.family import LLM, read_config
from llmbuild.families.minicpmv.model import load_vision, reference_features
from llmbuild.verify.stream_vlm import generate_with_rows


def reference_language_model(model_dir: Path) -> Any:
    """transformers' Qwen2ForCausalLM with the checkpoint's `llm.*` tensors (the MiniCPM-V config's top-level
    fields are the Qwen2 model's)."""
    import torch
    from safetensors import safe_open
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = read_config(model_dir)
    fields = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures", "vision_config",
                                                        "slice_config", "auto_map")}
    model = Qwen2ForCausalLM(Qwen2Config(**fields)).eval()
    state = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - a safetensors handle is not a dict
                if key.startswith(LLM):
                    state[key.removeprefix(LLM)] = f.get_tensor(key).to(torch.float32)
    missing, _ = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing:
        raise LlmbuildError(f"{model_dir}: missing language model tensor {LLM}{missing[0]}")
    if model.config.tie_word_embeddings:
        model.tie_weights()
    return model


def reference_generate(model_dir: Path, ids: list[int], slices: list[np.ndarray], image_token_id: int,
                       steps: int, eos: tuple[int, ...] = ()) -> tuple[list[int], np.ndarray]:
    """MiniCPM-V's greedy generation in torch: the embeddings of the `image_token_id` rows replaced by the
    reference features of `slices` (every image's, in prompt order), then Qwen2's greedy decoding. Returns
    (new ids, first-step logits)."""
    tower, resampler, _ = load_vision(model_dir)
    rows = [reference_features(tower, resampler, s) for s in slices]
    model = reference_language_model(model_dir)
    positions = [i for i, t in enumerate(ids) if t == image_token_id]
    feats = np.concatenate(rows) if rows else np.zeros((0, model.config.hidden_size), np.float32)
    if len(positions) != len(feats):
        raise LlmbuildError(f"the prompt has {len(positions)} image token rows, the slices give {len(feats)}")
    new, logits = generate_with_rows(model, ids, positions, feats, steps, eos)
    return new, logits[0]

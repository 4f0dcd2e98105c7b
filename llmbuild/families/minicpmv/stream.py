"""MiniCPM-V 2.6 with an image, streamed: what reference.reference_generate computes, without ever
holding the language model (a 7B one is 30 GB in float32; the e2e step must stay under 4 GiB).

- The vision path is the reference's own (model.reference_features: transformers' Idefics2
  tower at each piece's own size, then the published resampler), built on the meta device with the tower's
  encoder layers made one at a time from the checkpoint as they run (verify/stream_vlm.StreamedVisionLayer,
  as InternVL's tower is): SigLIP-400M is 1.7 GB in float32, one of its 27 layers 61 MB, so the vision path
  holds about 0.4 GB (the resampler's 270 MB and the position table) instead of 1.9 GB. It is dropped
  before the language model runs.
- The language model is the streamed reference's (verify/stream_model.py: transformers' Qwen2 one decoder
  layer at a time, on the weights the text reference reads, rounded as the build rounds them), with the
  embeddings of the `<unk>` placeholder rows replaced by the pieces' rows in prompt order, as MiniCPM-V's
  `get_vllm_embedding` does; then transformers' own greedy `generate` from those embeddings.

tests/test_minicpmv_hf.py checks it against the whole-model reference on the tiny model.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def streamed_vision(model_dir: Path) -> tuple[Any, Any, dict[str, Any]]:
    """(tower, resampler, config) as model.load_vision gives them, but the tower's encoder layers
    made from the checkpoint only while they run; the rest (embeddings, post_layernorm, the resampler) read
    whole."""
    import torch
    from torch import nn

    from llmbuild.families.minicpmv.family import RESAMPLER, VPM, read_config
    from llmbuild.families.minicpmv.model import build_modules
    from llmbuild.verify.stream_model import aligned
    from llmbuild.verify.stream_vlm import CheckpointTensors, StreamedVisionLayer

    cfg = read_config(model_dir)
    with torch.device("meta"):
        tower, resampler = build_modules(cfg)
    view = CheckpointTensors(model_dir)
    encoder = tower.encoder
    encoder.layers = nn.ModuleList(StreamedVisionLayer(layer, f"{VPM}encoder.layers.{i}.", view)
                                   for i, layer in enumerate(encoder.layers))
    for prefix, module in ((f"{VPM}embeddings.", tower.embeddings), (f"{VPM}post_layernorm.", tower.post_layernorm),
                           (RESAMPLER, resampler)):
        state = {key: aligned(view.get(prefix + key)) for key in module.state_dict()}
        module.load_state_dict(state, strict=True, assign=True)
    left = [name for name, t in [*tower.named_parameters(), *resampler.named_parameters()] if t.is_meta]
    if left:  # a part of the vision path this module does not know
        raise RuntimeError(f"streamed MiniCPM-V vision: {left[0]} was not materialised")
    return tower.eval(), resampler.eval(), cfg


def piece_rows(model_dir: Path, pieces: Sequence[np.ndarray]) -> np.ndarray:
    """[pieces * query_num, hidden]: every piece's resampler rows, overview and slices in order."""
    from llmbuild.families.minicpmv.model import reference_features

    tower, resampler, cfg = streamed_vision(model_dir)
    rows = [reference_features(tower, resampler, p) for p in pieces]
    del tower, resampler
    gc.collect()  # the vision path goes before the first decoder layer is made
    return np.concatenate(rows) if rows else np.zeros((0, int(cfg["hidden_size"])), np.float32)


def streamed_image_generate(weights: Any, model_dir: Path, prompt: list[int], pieces: Sequence[np.ndarray],
                            image_token_id: int, max_new_tokens: int,
                            eos: tuple[int, ...] = ()) -> tuple[list[int], np.ndarray]:
    """(greedy new ids, every step's logits [steps, V]) of MiniCPM-V on `prompt` with the image `pieces`
    (every image's, in prompt order), the language model streamed over `weights` (a ReferenceWeights)."""
    from llmbuild.verify.stream_vlm import streamed_rows_generate

    feats = piece_rows(model_dir, pieces)
    return streamed_rows_generate(weights, prompt, feats, image_token_id, max_new_tokens, eos)

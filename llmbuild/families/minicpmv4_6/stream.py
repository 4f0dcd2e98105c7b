"""MiniCPM-V 4.6 with an image, streamed: transformers' MiniCPMV4_6ForConditionalGeneration as its generate runs it,
without holding the model, and over the weights the build compiled.

- The vision path is transformers' own tower (its window-attention merger after `insert_layer_id`) and merger
  (model.reference_features: each piece at its own size), built on the meta device with the tower's encoder
  layers made one at a time from the checkpoint as they run (verify/stream_vlm.StreamedVisionLayer). It is
  dropped before the language model runs.
- The language model is the streamed text reference's (verify/stream_model.py: transformers' Qwen3.5 text model
  one decoder layer at a time, over the weights reference.reference_weights reads, rounded as the build rounds
  them). A w4 build checked against the float checkpoint would measure the rounding, not the compiler: on the
  real-size random-weight checkpoint, rounding alone moves the first logits to cosine 0.47.
- The image's rows replace the embeddings of the `<unk>` placeholder rows in prompt order, as the native
  model's `get_placeholder_mask` scatter does; then transformers' greedy `generate` from those embeddings.

tests/test_minicpmv4_6.py checks it against the whole native model on the tiny checkpoint.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ENCODER_LAYERS = "encoder.layers."


def streamed_vision(model_dir: Path) -> tuple[Any, Any]:
    """(tower, merger) as model.load_vision gives them, but the tower's encoder layers made from the checkpoint
    only while they run; the rest (embeddings, the window merger, post_layernorm, the merger) read whole."""
    import torch
    import transformers
    from torch import nn
    from transformers.models.minicpmv4_6 import modeling_minicpmv4_6 as native

    from llmbuild.families.minicpmv4_6.family import model_config_fields, read_config
    from llmbuild.families.minicpmv4_6.model import MERGER, TOWER
    from llmbuild.verify.stream_model import aligned
    from llmbuild.verify.stream_vlm import CheckpointTensors, StreamedVisionLayer

    config = transformers.MiniCPMV4_6Config(**model_config_fields(read_config(model_dir)))
    # transformers' default attention (torch's SDPA): eager attention at a slice's 4096 patches holds its
    # scores, mask and probabilities at once, 3 GiB a layer, which took the vision step past its 4 GiB.
    config.vision_config._attn_implementation = "sdpa"
    with torch.device("meta"):
        tower = native.MiniCPMV4_6VisionModel(config.vision_config)
        merger = native.MiniCPMV4_6Merger(config)
    view = CheckpointTensors(model_dir)
    encoder = tower.encoder
    encoder.layers = nn.ModuleList(StreamedVisionLayer(layer, f"{TOWER}{ENCODER_LAYERS}{i}.", view)
                                   for i, layer in enumerate(encoder.layers))
    for prefix, module in ((TOWER, tower), (MERGER, merger)):
        state = {key: aligned(view.get(prefix + key)) for key in module.state_dict()
                 if not key.startswith(ENCODER_LAYERS)}
        module.load_state_dict(state, strict=False, assign=True)
    left = [name for name, t in [*tower.named_parameters(), *merger.named_parameters()] if t.is_meta]
    if left:  # a part of the vision path this module does not know
        raise RuntimeError(f"streamed MiniCPM-V 4.6 vision: {left[0]} was not materialised")
    return tower.eval(), merger.eval()


def piece_rows(model_dir: Path, pieces: Sequence[np.ndarray], width: int) -> np.ndarray:
    """[rows, width]: every piece's merger rows, overview and slices in order."""
    from llmbuild.families.minicpmv4_6.model import reference_features

    tower, merger = streamed_vision(model_dir)
    rows = [reference_features(tower, merger, p) for p in pieces]
    del tower, merger
    gc.collect()  # the vision path goes before the first decoder layer is made
    return np.concatenate(rows) if rows else np.zeros((0, width), np.float32)


def streamed_image_generate(weights: Any, model_dir: Path, prompt: list[int], pieces: Sequence[np.ndarray],
                            image_token_id: int, max_new_tokens: int,
                            eos: tuple[int, ...] = ()) -> tuple[list[int], np.ndarray]:
    """(greedy new ids, every step's logits [steps, V]) of MiniCPM-V 4.6 on `prompt` with the image `pieces`
    (every image's, in prompt order), the language model streamed over `weights` (a ReferenceWeights)."""
    from llmbuild.verify.stream_vlm import streamed_rows_generate

    feats = piece_rows(model_dir, pieces, int(weights.config.hidden_size))
    return streamed_rows_generate(weights, prompt, feats, image_token_id, max_new_tokens, eos)

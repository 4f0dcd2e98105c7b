"""transformers' InternVL with an image, streamed: what `InternVLForConditionalGeneration.generate` computes,
without ever holding the model (a 2B one is 9 GB in float32; the e2e step must stay under 4 GiB).

- The tower is transformers' own (`get_image_features` over InternVLVisionModel, the pixel shuffle and the
  projector: model.vision_module) with its encoder layers made one at a time from the checkpoint
  (verify/stream_vlm.StreamedVisionLayer; a 300M tower's layer is 50 MB in float32), one tile at a time.
- The language model is the streamed reference's (verify/stream_model.py: one decoder layer at a time, on
  the same weights the text reference reads, rounded as the build rounds them).
- The image rows go where InternVLModel puts them: its `masked_scatter` fills the embeddings of the
  `<IMG_CONTEXT>` ids with the features in order, which verify/stream_vlm.streamed_rows_generate does; then
  transformers' own greedy `generate` from those embeddings.

tests/test_internvl_chat.py checks it against the whole InternVLForConditionalGeneration on the tiny model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from llmbuild.verify.stream_vlm import StreamedVisionLayer, streamed_rows_generate


def streamed_vision_module(model_dir: Path) -> tuple[Any, Any]:
    """(transformers' image-feature module with its encoder layers streamed, the InternVLConfig)."""
    from llmbuild.families.internvl.model import ENCODER_LAYERS, TensorView, vision_module

    module, config = vision_module(model_dir, layers=False)
    view = TensorView(model_dir)
    encoder = module.vision_tower.encoder
    encoder.layer = nn.ModuleList(StreamedVisionLayer(layer, f"model.{ENCODER_LAYERS}{i}.", view)
                                  for i, layer in enumerate(encoder.layer))
    return module, config


def image_features(model_dir: Path, pixels: np.ndarray) -> tuple[torch.Tensor, Any]:
    """([tiles * tokens, hidden] features of `pixels` [tiles, 3, S, S], one tile at a time; the config)."""
    module, config = streamed_vision_module(model_dir)
    with torch.no_grad():
        rows = [module(torch.from_numpy(pixels[i : i + 1])) for i in range(len(pixels))]
    return torch.cat(rows).reshape(-1, rows[0].shape[-1]), config


def image_generate(weights: Any, model_dir: Path, prompt: list[int], pixels: np.ndarray, max_new_tokens: int,
                   eos: tuple[int, ...]) -> tuple[list[int], np.ndarray]:
    """(greedy new ids, every step's logits [steps, V]) of transformers' InternVL on `prompt` with the image
    tiles `pixels`, the language model streamed over `weights` (a ReferenceWeights): the features in the
    `<IMG_CONTEXT>` rows in order, as InternVLModel's `masked_scatter` puts them."""
    features, config = image_features(model_dir, pixels)
    return streamed_rows_generate(weights, prompt, features.numpy(), config.image_token_id, max_new_tokens, eos)

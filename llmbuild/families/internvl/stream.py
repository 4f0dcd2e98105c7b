"""transformers' InternVL with an image, streamed: what `InternVLForConditionalGeneration.generate` computes,
without ever holding the model (a 2B one is 9 GB in float32; the e2e step must stay under 4 GiB).

- The tower is transformers' own (`get_image_features` over InternVLVisionModel, the pixel shuffle and the
  projector: model.vision_module) with its encoder layers made one at a time from the checkpoint
  (verify/stream_vlm.StreamedVisionLayer; a 300M tower's layer is 50 MB in float32), one tile at a time.
- The language model is the streamed reference's (verify/stream_model.py: one decoder layer at a time, on
  the same weights the text reference reads, rounded as the build rounds them).
- The image rows go where InternVLModel puts them: `masked_scatter` of the features over the embeddings of
  the `<IMG_CONTEXT>` ids; then transformers' own greedy `generate` from those embeddings.

tests/test_internvl_chat.py checks it against the whole InternVLForConditionalGeneration on the tiny model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from llmbuild.verify.stream_model import streamed_model
from llmbuild.verify.stream_vlm import StreamedVisionLayer


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
    tiles `pixels`, the language model streamed over `weights` (a ReferenceWeights)."""
    import transformers

    from llmbuild import LlmbuildError

    features, config = image_features(model_dir, pixels)
    model, _ = streamed_model(weights)
    ids = torch.tensor([prompt])
    mask = ids == config.image_token_id
    if int(mask.sum()) != features.shape[0]:
        raise LlmbuildError(f"reference: the prompt has {int(mask.sum())} image tokens (id {config.image_token_id}), "
                            f"the image {features.shape[0]} feature rows")
    generation = transformers.GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens,
                                               eos_token_id=list(eos) or None, pad_token_id=eos[0] if eos else 0,
                                               output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
        embeds = embeds.masked_scatter(mask[..., None].expand_as(embeds), features.to(embeds.dtype))
        out = model.generate(input_ids=ids, inputs_embeds=embeds, attention_mask=torch.ones_like(ids),
                             generation_config=generation)
    new = [int(i) for i in out.sequences[0, len(prompt) :]]
    return new, np.stack([step[0].numpy() for step in out.logits])

"""What the streamed image references of the vision-language families (their folders' `stream` modules) share:
a vision tower's encoder layers made from the checkpoint one at a time, as they run, so that no reference holds a
real-size tower (a 300M tower's layer is 50 MB in float32); and the language model's greedy generate with the
image's rows in its input embeddings.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from llmbuild import LlmbuildError
from llmbuild.verify.stream_model import aligned, streamed_model


class CheckpointTensors:
    """What StreamedVisionLayer reads a layer from: `get(name)`, float32, by the safetensors library."""

    def __init__(self, model_dir: Path) -> None:
        from llmbuild.verify.stream_weights import SafetensorsTables

        self.tables = SafetensorsTables(model_dir)

    def get(self, name: str) -> Any:
        return self.tables.tensor(name)


class StreamedVisionLayer(nn.Module):
    """Stands in for the tower's encoder layer `index`: made from the checkpoint while it runs."""

    def __init__(self, template: nn.Module, prefix: str, view: Any) -> None:
        super().__init__()
        self._parts = [template, view]  # a list: not registered, so no meta parameters show
        self.prefix = prefix

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        template, view = self._parts
        module = copy.deepcopy(template)
        state = {key: aligned(view.get(self.prefix + key)) for key in template.state_dict()}
        module.load_state_dict(state, strict=True, assign=True)
        return module.eval()(*args, **kwargs)


def generate_with_rows(model: Any, ids: list[int], positions: list[int], feats: np.ndarray, steps: int,
                       eos: tuple[int, ...]) -> tuple[list[int], np.ndarray]:
    """transformers' greedy generate of a causal LM (whole or streamed) on `ids`, the embeddings at
    `positions` replaced by `feats`: (new ids, every step's logits [steps, V]). inputs_embeds alone, so the
    returned sequence is the new ids only."""
    import torch
    import transformers

    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=steps, eos_token_id=list(eos) or None,
                                           pad_token_id=eos[0] if eos else 0, output_logits=True,
                                           return_dict_in_generate=True)
    with torch.no_grad():
        embeds = model.get_input_embeddings()(torch.tensor([ids])).clone()
        if positions:
            embeds[0, positions] = torch.from_numpy(feats)
        out = model.generate(inputs_embeds=embeds, attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
                             generation_config=config)
    return [int(i) for i in out.sequences[0]], np.stack([step[0].numpy() for step in out.logits])


def streamed_rows_generate(weights: Any, prompt: list[int], feats: np.ndarray, image_token_id: int, steps: int,
                           eos: tuple[int, ...]) -> tuple[list[int], np.ndarray]:
    """`generate_with_rows` of the language model streamed over `weights` (a ReferenceWeights), the image's
    `feats` in the rows of `image_token_id`, in prompt order: (new ids, every step's logits [steps, V])."""
    positions = [i for i, t in enumerate(prompt) if t == image_token_id]
    if len(positions) != len(feats):
        raise LlmbuildError(f"reference: the prompt has {len(positions)} image token rows (id {image_token_id}), "
                            f"the pieces give {len(feats)}")
    model, _ = streamed_model(weights)
    return generate_with_rows(model, prompt, positions, feats, steps, eos)

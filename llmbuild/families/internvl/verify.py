"""InternVL's checks: the vision step's case (`vision_cases`, and `vendor_vision_cases`, the same tile for the
bmodel's vit net) and the end-to-end image run of a binary, its greedy ids against transformers' (`image_e2e`).

The vision step feeds the vit net one pseudo-random tile and compares its features with transformers' own
`get_image_features` on the same weights (stream.py's module, its encoder layers made one at a time). The
image run tiles the test image (verify/check_image.test_image, twice as wide as a tile) as `llmbuild run
--image` tiles a user's file, puts `<img>`, the tiles' `<IMG_CONTEXT>` ids and `</img>` before the prompt, and
compares the binary's greedy ids and first logits with transformers' InternVLForConditionalGeneration.generate
on the same ids and pixels, streamed layer by layer over the text reference's weights (stream.image_generate).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from llmbuild.artifacts.paths import BuildPaths, vlm_dir
from llmbuild.importer.onnx_net import MASK_INPUT
from llmbuild.recipe_types import Recipe
from llmbuild.verify.similarity import similarity


def vision_inputs(net_shapes: dict[str, tuple[int, ...]], pixels: np.ndarray) -> dict[str, np.ndarray]:
    """The vit net's inputs for one tile: the pixels, and a zero mask where the net has one (InternViT
    attends to every patch)."""
    inputs = {"pixel_values": pixels}
    if MASK_INPUT in net_shapes:
        inputs[MASK_INPUT] = np.zeros(net_shapes[MASK_INPUT], np.float32)
    return inputs


def vision_cases(vlm: Path, seed: int, net_shapes: dict[str, tuple[int, ...]]
                 ) -> list[tuple[str, dict[str, np.ndarray], np.ndarray]]:
    """The vision step's case (verify/vision_cases.py): one tile of the net's `pixel_values` shape,
    pseudo-random from `seed`, with transformers' features for it."""
    import torch

    from llmbuild.families.internvl.stream import streamed_vision_module

    pixels = np.random.default_rng(seed).standard_normal(net_shapes["pixel_values"]).astype(np.float32)
    module, _ = streamed_vision_module(vlm)  # transformers' tower, its layers made one at a time
    with torch.no_grad():
        want = module(torch.from_numpy(pixels)).numpy()
    return [("tile", vision_inputs(net_shapes, pixels), want)]


def vendor_vision_cases(vlm: Path, seed: int, net_shapes: dict[str, tuple[int, ...]]
                        ) -> list[tuple[str, list[np.ndarray], np.ndarray]]:
    """The vision step's tile for the bmodel's vit net, whose one input is the pixels."""
    return [(name, [inputs["pixel_values"]], want) for name, inputs, want in vision_cases(vlm, seed, net_shapes)]


def image_e2e(recipe: Recipe, paths: BuildPaths, model: Any, text_ids: list[int], eos: tuple[int, ...]) -> dict:
    from llmbuild.families.internvl.stream import image_generate
    from llmbuild.verify.check_image import test_image
    from llmbuild.verify.greedy_runs import free_parting
    from llmbuild.verify.reference import reference_weights

    meta = model.vision.meta
    image = test_image(paths.root / "vision" / "test_image.png", int(meta["image_size"]))
    pixels = model.vision.pixels(image)  # tiled as `llmbuild run --image` tiles a user's file
    prompt = model.vision.image_ids(len(pixels)) + text_ids
    model.reset()
    ids, logits = model.generate(prompt, recipe.verify.max_new_tokens, eos, images=[pixels])
    model.release_weights()  # the reference below holds a layer, a tower layer and a tile's activations
    expected, reference_logits = image_generate(reference_weights(recipe, paths), vlm_dir(recipe, paths), prompt,
                                                pixels, recipe.verify.max_new_tokens, eos)
    return {"prompt_ids": prompt, "ids": ids, "reference_ids": expected, "tokens_equal": ids == expected,
            **free_parting(ids, expected, logits, reference_logits),
            "first_logits": similarity(logits[0], reference_logits[0])}

"""The end-to-end image run of a MiniCPM-V binary: its greedy ids against the torch reference's.

The test image (verify/check_image.test_image, twice as wide as a slice) is sliced by the runtime as `llmbuild run
--image` slices a user's file (an overview and two slices), the prompt holds its placeholder ids as
MiniCPM-V's processor writes them, and the binary's vit net fills the `<unk>` rows. The reference
(verify/stream_minicpmv.streamed_image_generate) runs transformers' tower on each piece at its own size, the
published resampler, and Qwen2's greedy generate with those rows in its input embeddings, the language model
streamed one decoder layer at a time over the text reference's weights (rounded as the build rounds them):
no part of it holds a real-size model.
"""

from __future__ import annotations

from typing import Any

from llmbuild.artifacts.paths import BuildPaths, vlm_dir
from llmbuild.recipe_types import Recipe
from llmbuild.verify.similarity import similarity


def minicpmv_image_e2e(recipe: Recipe, paths: BuildPaths, model: Any, text_ids: list[int],
                       eos: tuple[int, ...]) -> dict:
    from llmbuild.verify.check_image import test_image
    from llmbuild.verify.greedy_runs import first_difference
    from llmbuild.verify.reference import reference_weights
    from llmbuild.verify.stream_minicpmv import streamed_image_generate

    vision = model.vision
    image = test_image(paths.root / "vision" / "test_image.png", int(vision.meta["scale_resolution"]))
    sliced = vision.pixels(image)
    prompt = vision.image_ids(sliced, 0) + text_ids
    model.reset()
    steps = recipe.verify.max_new_tokens
    ids, logits = model.generate(prompt, steps, eos, images=[sliced])
    expected, reference_logits = streamed_image_generate(reference_weights(recipe, paths), vlm_dir(recipe, paths),
                                                         prompt, list(sliced.pieces),
                                                         int(vision.meta["image_token_id"]), steps, eos)
    return {"prompt_ids": prompt, "ids": ids, "reference_ids": expected, "tokens_equal": ids == expected,
            "first_difference": first_difference(ids, expected),
            "first_logits": similarity(logits[0], reference_logits[0]),
            "slices": len(sliced.pieces) - 1, "grid": list(sliced.grid) if sliced.grid else None}

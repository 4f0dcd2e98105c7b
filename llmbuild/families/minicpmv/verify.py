"""MiniCPM-V's checks: the vision step's cases (`vision_cases`) and the end-to-end image run of a binary, its
greedy ids against the torch reference's (`image_e2e`).

The test image (verify/check_image.test_image, twice as wide as a slice) is sliced by the runtime as `llmbuild run
--image` slices a user's file (an overview and two slices), the prompt holds its placeholder ids as
MiniCPM-V's processor writes them, and the binary's vit net fills the `<unk>` rows. The reference
(stream.streamed_image_generate) runs transformers' tower on each piece at its own size, the
published resampler, and Qwen2's greedy generate with those rows in its input embeddings, the language model
streamed one decoder layer at a time over the text reference's weights (rounded as the build rounds them):
no part of it holds a real-size model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from llmbuild.artifacts.paths import BuildPaths, vlm_dir
from llmbuild.recipe_types import Recipe
from llmbuild.verify.similarity import similarity


def image_e2e(recipe: Recipe, paths: BuildPaths, model: Any, text_ids: list[int],
                       eos: tuple[int, ...]) -> dict:
    from llmbuild.families.minicpmv.stream import streamed_image_generate
    from llmbuild.verify.check_image import test_image
    from llmbuild.verify.greedy_runs import free_parting
    from llmbuild.verify.reference import reference_weights

    vision = model.vision
    image = test_image(paths.root / "vision" / "test_image.png", int(vision.meta["scale_resolution"]))
    sliced = vision.pixels(image)
    prompt = vision.image_ids(sliced, 0) + text_ids
    model.reset()
    steps = recipe.verify.max_new_tokens
    ids, logits = model.generate(prompt, steps, eos, images=[sliced])
    model.release_weights()  # the reference below runs in this process
    expected, reference_logits = streamed_image_generate(reference_weights(recipe, paths), vlm_dir(recipe, paths),
                                                         prompt, list(sliced.pieces),
                                                         int(vision.meta["image_token_id"]), steps, eos)
    return {"prompt_ids": prompt, "ids": ids, "reference_ids": expected, "tokens_equal": ids == expected,
            **free_parting(ids, expected, logits, reference_logits),
            "first_logits": similarity(logits[0], reference_logits[0]),
            "slices": len(sliced.pieces) - 1, "grid": list(sliced.grid) if sliced.grid else None}


def vision_grids(capacity: int, scale_side: int) -> list[tuple[int, int]]:
    """(rows, columns) patch grids to check: one patch, the slice's square, a wide and a tall one, and the
    most patches the net holds (its `capacity`)."""
    wide = (max(1, scale_side - 1), scale_side + 1)
    tall = (wide[1], wide[0])
    most = next((h, capacity // h) for h in range(int(capacity**0.5), 0, -1) if capacity % h == 0)
    grids = [(1, 1), (scale_side, scale_side), wide, tall, most]
    return [g for i, g in enumerate(grids) if g[0] * g[1] <= capacity and g not in grids[:i]]


def vision_cases(vlm: Path, seed: int, net_shapes: dict[str, tuple[int, ...]] | None = None
                 ) -> list[tuple[str, dict[str, np.ndarray], np.ndarray]]:
    """The vision step's cases (verify/vision_cases.py): (name, the net's inputs, the reference's features)
    for pieces of `vision_grids`, pseudo-random from `seed`, fed padded with the host-computed inputs, against
    the reference at the piece's own size (transformers' tower computes its positions itself, no padding).
    The inputs' shapes come from config.json as the export's did (`net_shapes`, the compiled net's, agree)."""
    from llmbuild.families.minicpmv.inputs import slice_inputs

    def inputs(piece: np.ndarray, geo: dict[str, int]) -> dict[str, np.ndarray]:
        return slice_inputs(piece, geo["patch"], geo["max_patches"], geo["side"], geo["queries"], geo["embed_dim"])

    return _cases(vlm, seed, inputs)


def vendor_vision_cases(vlm: Path, seed: int, net_shapes: dict[str, tuple[int, ...]] | None = None
                        ) -> list[tuple[str, list[np.ndarray], np.ndarray]]:
    """The same pieces for the bmodel's vit net: its inputs in its order, as LLM-TPU's runtime feeds them
    (inputs.vendor_inputs), for the grids its position table addresses (no side above the table's)."""
    from llmbuild.families.minicpmv.inputs import vendor_inputs

    def inputs(piece: np.ndarray, geo: dict[str, int]) -> list[np.ndarray]:
        return vendor_inputs(piece, geo["patch"], geo["max_patches"], geo["side"], geo["queries"])

    def keep(grid: tuple[int, int], geo: dict[str, int]) -> bool:
        return max(grid) <= geo["side"]

    return _cases(vlm, seed, inputs, keep)


def _cases(vlm: Path, seed: int, make_inputs: Any, keep: Any = None) -> list:
    """(name, make_inputs(piece, geometry), the reference's features) for each grid of `vision_grids` that
    `keep(grid, geometry)` keeps (every one without it)."""
    from llmbuild.families.minicpmv.family import vit_geometry
    from llmbuild.families.minicpmv.model import load_vision, reference_features

    tower, resampler, cfg = load_vision(vlm)
    geo = vit_geometry(cfg)
    p = geo["patch"]
    rng = np.random.default_rng(seed)
    cases = []
    for h, w in vision_grids(geo["max_patches"], geo["scale"] // p):
        piece = rng.standard_normal((3, h * p, w * p)).astype(np.float32)  # drawn for every grid: the same pieces
        if keep is None or keep((h, w), geo):
            want = reference_features(tower, resampler, piece)[None]
            cases.append((f"{w}x{h} patches", make_inputs(piece, geo), want))
    return cases

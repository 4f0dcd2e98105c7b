"""MiniCPM-V 4.6's checks: the vision step's cases (`vision_cases`) and the end-to-end image run of a binary, its
greedy ids against transformers' native MiniCPMV4_6ForConditionalGeneration (`image_e2e`).

The test image (verify/check_image.test_image, twice as wide as a slice) is sliced by the runtime as `llmbuild
run --image` slices a user's file (an overview and two slices), the prompt holds its placeholder ids as the
model's processor writes them, and the binary's vit net fills the `<unk>` rows. The reference
(stream.streamed_image_generate) is transformers' tower and merger on each piece, and its Qwen3.5 text model
streamed one decoder layer at a time over the weights the build compiled (rounded as it rounds them), those
rows in its input embeddings; `native_generate` (the whole MiniCPMV4_6ForConditionalGeneration given the pieces
NaViT-packed with their target_sizes) is what the tests hold both to on the tiny model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from llmbuild.artifacts.paths import BuildPaths, vlm_dir
from llmbuild.recipe_types import Recipe
from llmbuild.verify.similarity import similarity


def packed(pieces: list[np.ndarray], patch: int) -> tuple[np.ndarray, np.ndarray]:
    """Pieces [3, h*patch, w*patch] as the image processor packs them: pixel_values [1, 3, patch, n*patch]
    (patch rows of each piece in turn) and target_sizes [(h, w), ...]."""
    runs, sizes = [], []
    for piece in pieces:
        _, height, width = piece.shape
        h, w = height // patch, width // patch
        runs.append(piece.reshape(3, h, patch, w, patch).transpose(0, 2, 1, 3, 4).reshape(3, patch, h * w * patch))
        sizes.append((h, w))
    return np.concatenate(runs, axis=-1)[None].astype(np.float32), np.asarray(sizes, np.int32)


def native_generate(model: Any, prompt: list[int], pieces: list[np.ndarray], steps: int,
                    eos: tuple[int, ...] = ()) -> tuple[list[int], np.ndarray]:
    """transformers' greedy generate of MiniCPMV4_6ForConditionalGeneration on `prompt` with the image pieces
    (every image's, in prompt order): (new ids, first-step logits)."""
    import torch

    patch = int(model.config.vision_config.patch_size)
    pixel_values, target_sizes = packed(pieces, patch)
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt]), pixel_values=torch.from_numpy(pixel_values),
                             target_sizes=torch.from_numpy(target_sizes), max_new_tokens=steps, do_sample=False,
                             eos_token_id=list(eos) or None, pad_token_id=eos[0] if eos else 0,
                             output_logits=True, return_dict_in_generate=True)
    return [int(i) for i in out.sequences[0, len(prompt):]], out.logits[0][0].numpy()


def native_model(model_dir: Path) -> Any:
    import torch
    import transformers

    model = transformers.MiniCPMV4_6ForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


def image_e2e(recipe: Recipe, paths: BuildPaths, model: Any, text_ids: list[int], eos: tuple[int, ...]) -> dict:
    from llmbuild.families.minicpmv4_6.stream import streamed_image_generate
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


def vision_grids(cap: int, scale_side: int) -> list[tuple[int, int]]:
    """(rows, columns) patch grids to check: the smallest piece, the slice's square, a wide and a tall one, and
    the most patches the net holds (its capacity), each side a multiple of 4."""
    side = max(4, scale_side // 4 * 4)
    grids = [(4, 4), (side, side), (4, side + 4), (side + 4, 4), (4, cap // 4 // 4 * 4)]
    return [g for i, g in enumerate(grids) if g[0] * g[1] <= cap and g not in grids[:i]]


def vision_cases(vlm: Path, seed: int, net_shapes: dict[str, tuple[int, ...]] | None = None
                 ) -> list[tuple[str, dict[str, np.ndarray], np.ndarray]]:
    """The vision step's cases (verify/vision_cases.py): (name, the net's inputs, transformers' rows)
    for pieces of `vision_grids`, pseudo-random from `seed`."""
    from llmbuild.families.minicpmv4_6.family import read_config, vit_geometry
    from llmbuild.families.minicpmv4_6.inputs import slice_inputs
    from llmbuild.families.minicpmv4_6.model import reference_features
    from llmbuild.families.minicpmv4_6.stream import streamed_vision

    # The tower's layers made as they run: the vision step also holds the net's weights and the device's image
    # (SigLIP-400M whole is 1.6 GB in float32, one of its layers 60 MB).
    tower, merger = streamed_vision(vlm)
    geo = vit_geometry(read_config(vlm))
    p, cap = geo["patch"], geo["capacity"]
    rng = np.random.default_rng(seed)
    cases = []
    for h, w in vision_grids(cap, geo["scale"] // p):
        piece = rng.standard_normal((3, h * p, w * p)).astype(np.float32)
        inputs = slice_inputs(piece, p, cap, geo["side"])
        cases.append((f"{w}x{h} patches", inputs, reference_features(tower, merger, piece)[None]))
    return cases

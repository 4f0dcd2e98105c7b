"""`llmbuild e2e RECIPE`: run the linked binary against transformers' generate.

The binary runs on the host path (the same programs as the simulated device, tested bit for bit equal to
it; the layer checks run the device itself on sampled layers), which reads the weights from the
memory-mapped binary: a 7B binary is never copied into memory.

The binary is teacher-forced along the reference's greedy run (each step fed the reference's token), so
every step's logits are compared in the reference's context. Records (tolerances are applied by
`llmbuild verify`): the binary's choice at every step and the reference's greedy ids, where they first
part and both runs' top-2 logit gaps there (a near-tie explains a parting; a wide gap is a bug), how many
steps differ, the similarity of every step's logits; and whether llmbuild's own chat templating gave the
prompt ids that transformers' apply_chat_template gave.
"""

from __future__ import annotations

import time

import numpy as np

from llmbuild.artifacts.paths import BuildPaths, write_json
from llmbuild.recipe_types import Recipe
from llmbuild.runtime.compiled_model import CompiledModel, load_tokenizer
from llmbuild.verify.greedy_runs import parting, teacher_forced
from llmbuild.verify.reference import load_reference
from llmbuild.verify.similarity import similarity

# Decoded weights the check keeps: the host path's default (a 1.5B model's whole in 16 bits), small enough
# that the step stays under 4 GiB with a 7B binary (build/resources.py).
E2E_CACHE_BYTES = 3 << 30
# With an image the same process also runs the family's reference streamed (InternVL's: torch, a decoder
# layer and its rounding, a tower layer, a tile's activations: about 2 GB for InternVL3-2B), so the
# binary keeps less decoded and dequantizes the rest tile by tile (the same bits, more time).
E2E_VLM_CACHE_BYTES = 768 << 20


def run_e2e(recipe: Recipe) -> dict:
    paths = BuildPaths.of(recipe)
    ref = load_reference(paths.reference, ("generate.",))
    prompt = [int(i) for i in ref["generate.prompt_ids"]]
    expected = [int(i) for i in ref["generate.ids"]]
    cache = E2E_CACHE_BYTES if recipe.vision is None else E2E_VLM_CACHE_BYTES
    model = CompiledModel(paths.binary(recipe.name), faithful=False, cache_bytes=cache)
    eos = tuple(model.meta["eos_token_ids"])
    start = time.perf_counter()
    logits = teacher_forced(model, prompt, expected)
    seconds = time.perf_counter() - start
    ids = [int(np.argmax(step)) for step in logits]
    result = {
        "prompt_ids": prompt,
        "ids": ids,
        "reference_ids": expected,
        "tokens_equal": ids == expected,
        **parting(ids, expected, logits, ref["generate.logits"]),
        "first_logits": similarity(logits[0], ref["generate.logits"][0]),
        "step_logits": [similarity(a, b) for a, b in zip(logits, ref["generate.logits"], strict=True)],
        "host_seconds": round(seconds, 3),
        "executor": "host",
    }
    if recipe.verify.prompt and model.meta.get("chat_template"):
        # The prompt went through the checkpoint's chat template (verify/reference.py: prompt_ids_for).
        tok = load_tokenizer(model)
        own = tok.chat_ids([{"role": "user", "content": recipe.verify.prompt}])
        result["chat_template_ids_equal"] = own == prompt
        result["text"] = tok.decode(ids)
    if recipe.vision is not None:
        result["image"] = image_e2e(recipe, paths, model, [int(i) for i in ref["generate.prompt_ids"]], eos)
    write_json(paths.e2e, result)
    return result


def image_e2e(recipe: Recipe, paths: BuildPaths, model: CompiledModel, text_ids: list[int],
              eos: tuple[int, ...]) -> dict:
    """The binary with an image (its rows from the vit net, copied into the image tokens' rows) against the
    family's reference on the same ids and image (its folder's `verify.image_e2e`): greedy ids and the first
    step's logits."""
    from llmbuild.families.registry import family_part

    return family_part(model.vision.family, "verify").image_e2e(recipe, paths, model, text_ids, eos)

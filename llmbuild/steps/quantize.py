"""`llmbuild quantize RECIPE`: quantize the float checkpoint with a library (GPTQ, AWQ, AutoRound).

The result is the library's own checkpoint format in `build/<recipe>/quantized/`, which the rest of the
build imports exactly as it imports a downloaded GPTQ/AWQ/AutoRound checkpoint: one import path, and the
quantized checkpoint is a file a person (or another tool) can open. A GGUF source is first written out
as a float Hugging Face checkpoint, since the libraries load models through transformers.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from llmbuild import LlmbuildError
from llmbuild.artifacts.paths import BuildPaths, read_spec, tokenizer_dir, write_json
from llmbuild.progress_log import StepProgress
from llmbuild.quant.scheme import recipe_scheme
from llmbuild.recipe_types import LIBRARY_METHODS, Recipe

SEED = 0


def quantize(recipe: Recipe) -> dict:
    q = recipe.quantization
    if q.origin not in LIBRARY_METHODS:
        raise LlmbuildError(f"{recipe.path}: quantization.method: expected one of {', '.join(LIBRARY_METHODS)} "
                            f"for a quantize step, got {q.method} (origin {q.origin})")
    from llmbuild.quant.methods import quantize_checkpoint
    from llmbuild.quant.methods.calibration import calibration_ids

    paths = BuildPaths.of(recipe)
    scheme = recipe_scheme(q)
    assert scheme is not None and q.calibration is not None
    start = time.perf_counter()
    # Phases only: the library quantizes layer by layer inside one call (its own log lines come between).
    progress = StepProgress(f"quantize ({q.origin})")
    ids = calibration_ids(Path(q.calibration), tokenizer_dir(recipe, paths), q.calibration_samples,
                          q.calibration_length)
    progress.note(f"{len(ids)} calibration samples of {q.calibration_length} tokens ready")
    float_dir = _float_checkpoint(recipe, paths)
    progress.note(f"float checkpoint ready; {q.origin} quantizes it now")
    try:
        report = quantize_checkpoint(q.origin, float_dir, paths.quantized, bits=scheme.bits,
                                     group_size=q.group_size, sym=q.sym, desc_act=q.desc_act,
                                     calibration_ids=ids, seed=SEED, options=dict(q.options))
    finally:
        if recipe.source.kind == "gguf":  # the exported float copy: 4 bytes a parameter, not kept
            shutil.rmtree(float_dir, ignore_errors=True)
    report = {**report, "recipe": recipe.name, "calibration": {"file": q.calibration, "samples": len(ids),
              "tokens_per_sample": q.calibration_length}, "step_seconds": round(time.perf_counter() - start, 1)}
    write_json(paths.root / "quantize.json", report)
    progress.note("quantized checkpoint written")
    return report


def _float_checkpoint(recipe: Recipe, paths: BuildPaths) -> Path:
    """A float Hugging Face checkpoint directory of the source, for the library to load."""
    if recipe.source.kind == "synthetic":
        return paths.checkpoint
    if recipe.source.kind == "hf":
        assert recipe.source.path is not None
        return Path(recipe.source.path)
    from llmbuild.frontend.export_hf import export_hf_checkpoint
    from llmbuild.frontend.sources import open_source

    out = paths.root / "float_hf"
    export_hf_checkpoint(open_source(recipe.source, paths.checkpoint), read_spec(paths.spec), paths.checkpoint, out)
    return out

"""What the Snakefile asks of a recipe while it builds the DAG: layer counts and rerun digests.

Each rule takes, as params, a digest of exactly the recipe fields its step depends on, plus a digest
of llmbuild's own code: Snakemake reruns a step when one of them changes, and only then.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

from llmbuild.quant.scheme import recipe_scheme
from llmbuild.recipe import load_recipe, section_digest
from llmbuild.recipe.schema import Recipe

PACKAGE_DIR = Path(__file__).resolve().parent.parent

# Which recipe sections each step reads. `verify` is split: the reference run depends on the prompt
# and the generation length; the tolerances only matter to the final verify step.
STEP_SECTIONS = {
    "prepare": ("source", "architecture"),
    "reference": ("source", "architecture", "stages"),
    "plan": ("source", "architecture", "quantization", "target", "stages"),
    "compile": ("source", "architecture", "quantization", "target", "stages"),
    "verify": ("verify",),
    "quantize": ("source", "architecture", "quantization"),
}
# The code a step's outputs depend on, where that is narrower than the whole package (dag.code_digest).
# `prepare` (the float checkpoint, spec.json) comes first in every recipe's DAG: were it rerun by any
# compiler change, everything after it would be, the quantize step's minutes of calibration included.
# (Snakemake's ancient() would stop that cascade, but in 9.27 it also masks the steps after it.)
_FLOAT_INPUT_CODE = ("frontend", "build/paths.py", "numerics/formats.py")
STEP_CODE = {
    "prepare": (*_FLOAT_INPUT_CODE, "build/prepare.py"),
    "quantize": (*_FLOAT_INPUT_CODE, "quant/methods", "quant/scheme.py", "build/quantize.py"),
}
GENERATION_FIELDS = ("prompt", "prompt_ids", "max_new_tokens")


def missing_checkpoints(names: list[str]) -> dict[str, str]:
    """Recipe name -> the loader's message, for recipes whose checkpoint is not on this machine."""
    from llmbuild import MissingCheckpointError

    missing = {}
    for name in names:
        try:
            recipe(name)
        except MissingCheckpointError as exc:
            missing[name] = str(exc)
    return missing


@cache
def recipe(name: str) -> Recipe:
    return load_recipe(name)


def code_digest(step: str | None = None) -> str:
    """sha256 over the llmbuild sources and data a step runs (STEP_CODE), else over the whole package: a
    new compiler means new outputs."""
    return _digest_of(STEP_CODE.get(step or "", ()))


@cache
def _digest_of(parts: tuple[str, ...]) -> str:
    """Keyed by the parts, not the step: the whole-package hash is read once per Snakefile parse, not
    once for each of the steps that share it."""
    roots = [PACKAGE_DIR / part for part in parts] if parts else [PACKAGE_DIR]
    h = hashlib.sha256()
    for root in roots:
        for path in sorted(root.rglob("*")) if root.is_dir() else [root]:
            if path.is_file() and path.suffix in (".py", ".yaml", ".txt", ".json") and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(PACKAGE_DIR)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()[:16]


def digest(name: str, step: str) -> str:
    r = recipe(name)
    d = section_digest(r, *STEP_SECTIONS["reference" if step == "e2e" else step])
    if step in ("reference", "e2e"):
        gen = {k: r.raw.get("verify", {}).get(k) for k in GENERATION_FIELDS}
        # A quantized build's reference uses the dequantized weights: it depends on the weight scheme
        # (bits, group), not on the activation type, so f32 -> bf16 does not rerun it, f32 -> w4 does.
        scheme = recipe_scheme(r.quantization)
        gen["weights"] = None if scheme is None else [r.quantization.origin, scheme.bits, scheme.group_size,
                                                      scheme.act_order, scheme.per_channel_8bit]
        d = hashlib.sha256((d + json.dumps(gen, sort_keys=True)).encode()).hexdigest()
    if step == "e2e":
        d = hashlib.sha256((d + section_digest(r, *STEP_SECTIONS["compile"])).encode()).hexdigest()
    if step == "quantize" and r.quantization.calibration:
        text = Path(r.quantization.calibration).read_bytes()  # the data, wherever the file lives
        d = hashlib.sha256(d.encode() + hashlib.sha256(text).digest()).hexdigest()
    return d[:16]


def uses_quantize_step(name: str) -> bool:
    from llmbuild.recipe.schema import LIBRARY_METHODS

    return recipe(name).quantization.origin in LIBRARY_METHODS


def calibration_file(name: str) -> list[str]:
    r = recipe(name)
    return [r.quantization.calibration] if uses_quantize_step(name) and r.quantization.calibration else []


@cache
def _params_billions(name: str) -> float:
    from llmbuild.cost.model import param_count
    from llmbuild.frontend.config_spec import spec_without_weights

    return param_count(spec_without_weights(recipe(name).source)) / 1e9


def quantize_mem_mb(name: str) -> int:
    """The float model in f32 plus calibration activations and the library's copies: ~3x the f32 size."""
    return int(2000 + 3 * 4 * 1000 * _params_billions(name))


def quantize_runtime_min(name: str) -> int:
    """Minutes a cluster scheduler should allow: measured ~5 min per 0.1B parameters for GPTQ on 2 CPU
    cores (docs/performance.md); a GPU node is far faster, so this is an upper bound."""
    return int(10 + 50 * 10 * _params_billions(name))


@cache
def layer_count(r: Recipe | str) -> int:
    if isinstance(r, str):
        r = recipe(r)
    src = r.source
    if src.kind == "synthetic":
        assert src.config is not None
        return int(src.config["num_hidden_layers"])
    if src.kind == "hf":
        assert src.path is not None
        cfg = json.loads((Path(src.path) / "config.json").read_text())
        cfg = cfg.get("text_config", cfg)
        return int(cfg["num_hidden_layers"])
    from llmbuild.frontend import gguf_file
    from llmbuild.frontend.gguf_source import gguf_metadata

    meta = gguf_metadata(gguf_file(src))
    arch = meta["general.architecture"]
    return int(meta[f"{arch}.block_count"])

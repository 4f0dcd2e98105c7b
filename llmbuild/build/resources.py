"""What each build step needs from a machine: peak memory (mem_mb) and a time limit (runtime, minutes),
computed from the model's shapes and the recipe, never from the machine.

Snakemake schedules with them (`snakemake --resources mem_mb=20000` runs at once only the jobs whose
declared memory fits), and a cluster profile turns them into the node a job asks for. So they must be
close to what a step really uses: too low and a 24 GiB machine runs out of memory, too high and jobs
wait for nothing. Each formula is the step's own accounting (which buffers it holds at its peak), with
constants fitted to measured peaks (benchmarks/scale.py prints declared against measured for every rule;
docs/performance.md keeps the table), and stays within 1.5x of the measurement at every measured size.

Times are generous upper bounds for a slow 2-core machine: a scheduler kills a job that overruns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from llmbuild.frontend.arch.base import expected_shapes
from llmbuild.frontend.spec import ModelSpec
from llmbuild.recipe.schema import Recipe

MB = 1 << 20
# Resident size of a step's process before it touches the model: Python, numpy, xDSL and llmbuild; torch
# and transformers on top for the steps that import them.
BASE_MB = {"compile": 160, "torch": 520, "light": 90}


@dataclass(frozen=True)
class Resources:
    mem_mb: int
    runtime_min: int


@dataclass(frozen=True)
class ModelSize:
    """The sizes the steps' memory depends on, in parameters."""

    layer: int  # weights of one decoder layer
    vocab_table: int  # vocab x hidden (one table)
    tables: int  # 1 when lm_head is tied to the embedding, else 2
    layers: int
    hidden: int
    intermediate: int
    kv_width: int  # kv heads x head dim


def model_size(spec: ModelSpec) -> ModelSize:
    one = expected_shapes(replace(spec, num_layers=1))
    layer = sum(math.prod(s) for n, s in one.items() if n.startswith("layers."))
    return ModelSize(layer, spec.vocab_size * spec.hidden_size, 1 if spec.tie_word_embeddings else 2,
                     spec.num_layers, spec.hidden_size, spec.intermediate_size, spec.num_kv_heads * spec.head_dim)


def _weight_bits(recipe: Recipe) -> int:
    mode = recipe.quantization.mode
    return 4 if mode.startswith("w4") else 8 if mode.startswith("w8") else 32 if mode == "f32" else 16


def step_resources(recipe: Recipe, spec: ModelSpec, step: str) -> Resources:
    size = model_size(spec)
    L, S = recipe.stages.prefill_length, recipe.stages.seq_length
    T = 2 * recipe.verify.check_tokens + 1  # reference tokens
    quantized = _weight_bits(recipe) < 16
    billions = (size.layer * size.layers + size.vocab_table * size.tables) / 1e9
    if step == "layer":
        # Float32 weights as TopOp reads them and once more decoded (dequantized) by the device executor,
        # the stored form beside them, plus prefill activations (rows x intermediate, a few at once).
        per_param = 8.0 + (1.5 if quantized else 4.0)
        activations = 10 * 4 * min(L, 2 * recipe.verify.check_tokens + 64) * (size.hidden + size.intermediate)
        attention = 4 * 4 * L * (S + L) if L * (S + L) < (1 << 26) else 4 * 4 * 256 * (S + L)
        mb = BASE_MB["compile"] + (per_param * size.layer + activations + attention) / MB
        minutes = 2 + billions * 3
    elif step == "head":
        # Tables are streamed in 64 MB blocks when large; small ones (< 256 MB) are held whole, decoded.
        table = 4 * size.vocab_table
        held = table * (3 if table <= 256 * MB else 0) + (128 * MB if table > 256 * MB else 0)
        mb = BASE_MB["compile"] + held / MB + 4 * size.vocab_table * _head_quantized(recipe) * 3 / MB
        minutes = 2 + billions * 2
    elif step == "reference":
        # transformers: one float32 layer at a time (and its load), activations of T tokens, logits blocks.
        mb = BASE_MB["torch"] + (3 * 4 * size.layer + 4 * T * 4 * (size.hidden + size.intermediate)) / MB + 256
        minutes = 5 + billions * 10
    elif step == "e2e":
        # The host path: decoded weights up to its cache (1 GiB), a decoded tile, the KV cache.
        decoded = min(4 * (size.layer * size.layers + size.vocab_table * size.tables), 5 << 29)  # verify/e2e.py
        kv = 2 * 4 * size.layers * (S + L) * size.kv_width
        mb = BASE_MB["torch"] + (decoded + kv + 4 * size.vocab_table // 8) / MB + 128
        minutes = 5 + billions * 15
    elif step == "link":
        mb = BASE_MB["compile"] + 64
        minutes = 2 + billions
    elif step == "quantize":
        # The library holds the float model in f32, calibration activations and its own copies.
        mb = 2000 + 3 * 4 * 1000 * billions
        minutes = 10 + 500 * billions  # measured ~5 min per 0.1B parameters for GPTQ on 2 CPU cores
    else:  # prepare, plan, verify: headers and JSON
        mb = BASE_MB["light"] + 64
        minutes = 2
    return Resources(int(math.ceil(mb)), int(math.ceil(minutes)))


def _head_quantized(recipe: Recipe) -> int:
    return 1 if recipe.quantization.lm_head not in (None, "float") else 0

"""What each build step needs from a machine: peak memory (mem_mb) and a time limit (runtime, minutes),
computed from the model's shapes and the recipe, never from the machine.

Snakemake schedules with them (`snakemake --resources mem_mb=20000`, the default of the workflow profile,
runs at once only the jobs whose declared memory fits), and a cluster profile turns them into the node a
job asks for. So they must be close to what a step really uses: too low and a 24 GiB machine runs out of
memory, too high and jobs wait for nothing. Each formula is the step's own accounting (which buffers it
holds at its peak, in bytes per weight of one layer, of the model, or of a vocabulary table), with
constants fitted to measured peaks of SmolLM2-135M, the 1.5B and the 7B/8B builds (benchmarks/scale.py
prints declared against measured for every rule; docs/performance.md keeps the table).

Times are generous upper bounds for a slow 2-core machine: a scheduler kills a job that overruns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from llmbuild.artifacts.paths import VIT_NET
from llmbuild.families.layout import expected_shapes
from llmbuild.families.registry import family_part
from llmbuild.families.spec import ModelSpec
from llmbuild.numerics.compiled_dequant import MIN_WEIGHTS
from llmbuild.recipe_types import Recipe
from llmbuild.verify import reference_memory

MB = 1 << 20
# Resident size of a step's process before it touches the model: Python, numpy, xDSL and llmbuild; torch
# and transformers on top for the reference.
# "runtime": numpy, tokenizers and the one-row product's LLVM (llvmlite: 76 MB resident once it compiles)
BASE_MB = {"compile": 180, "check": 300, "runtime": 230, "torch": 600, "light": 150}
HOST_CACHE = 3 << 30  # verify/e2e.py: E2E_CACHE_BYTES
VLM_HOST_CACHE = 768 << 20  # verify/e2e.py: E2E_VLM_CACHE_BYTES
# The vision step, per weight of the tower and per tile activation value: fitted to InternVL3-2B's measured
# peaks (vision 3.1 GB, e2e 3.7-4.1 GB; docs/performance.md).
VISION_BYTES = 8.0
VISION_TILE_BYTES = 16.0
# Minutes a billion tower weights: InternVL3-2B's 312M took 2.5 min (4.8 min on a busy machine): the
# export, the import, the compile and the device check of one 1025-token tile.
VISION_MINUTES = 12
TABLE_BLOCK = 64 << 20  # build/weight_file.py and the kernels read big tables in blocks of about this


@dataclass(frozen=True)
class Resources:
    mem_mb: int
    runtime_min: int


@dataclass(frozen=True)
class ModelSize:
    """The sizes the steps' memory depends on, in weights."""

    layer: int  # weights of one decoder layer
    vocab_table: int  # vocab x hidden (one table)
    tables: int  # 1 when lm_head is tied to the embedding, else 2
    layers: int
    hidden: int
    intermediate: int
    kv_width: int  # kv heads x head dim
    vocab: int


def model_size(spec: ModelSpec) -> ModelSize:
    one = expected_shapes(replace(spec, num_layers=1))
    layer = sum(math.prod(s) for n, s in one.items() if n.startswith("layers."))
    return ModelSize(layer, spec.vocab_size * spec.hidden_size, 1 if spec.tie_word_embeddings else 2,
                     spec.num_layers, spec.hidden_size, spec.intermediate_size, spec.num_kv_heads * spec.head_dim,
                     spec.vocab_size)


@dataclass(frozen=True)
class Tower:
    weights: int  # the vit net's: patch embedding, positions, layers, projector
    layer: int  # one encoder layer's
    activations: int  # tokens x the tower's widest row (the MLP's), one tile
    # Bytes of every op's output for one tile (q, k, v, attention, o, norms and residuals ~10 rows of width
    # c, the MLP ~3 of i); the host path drops each after its last reader, but not all of it in e2e's runs.
    held: int


def tower_weights(recipe: Recipe, text_hidden: int) -> Tower | None:
    """A vision tower's size from the recipe's configuration, where its family's `cost` module gives one
    (`tower_size`: InternVL's, either layout); None: the steps' defaults hold it (MiniCPM-V's)."""
    if recipe.vision is None:
        return None
    size = family_part(recipe.vision.family, "cost").tower_size(recipe.source, recipe.vision, text_hidden)
    return None if size is None else Tower(**size)


def _compiled_weights(recipe: Recipe, spec: ModelSpec) -> int:
    """Weights of the 4-bit projections the compiled dequantizer reads from their levels (numerics/
    compiled_dequant.py: MIN_WEIGHTS or more, whole model), which the host path never keeps dequantized."""
    if not recipe.quantization.mode.startswith("w4"):
        return 0
    one = expected_shapes(replace(spec, num_layers=1))
    per_layer = sum(math.prod(s) for n, s in one.items()
                    if n.startswith("layers.") and len(s) == 2 and math.prod(s) >= MIN_WEIGHTS)
    return per_layer * spec.num_layers


def _host_kept_bytes(recipe: Recipe, spec: ModelSpec, cache: int) -> float:
    """Bytes the host path keeps (runtime/host.py): what products read, up to `cache`, in 16 bits (bf16 and
    f16 weights as stored, which the compiled one-row product reads as they are, and 4-bit weights
    dequantized to bf16), in float32 for an f32 model and a w*f16 one's dequantized weights; the projections
    the compiled dequantizer reads from their levels as those levels (half a byte a weight); not an embedding
    only gathered (an untied one)."""
    size = model_size(spec)
    weights = size.layer * size.layers + size.vocab_table * size.tables
    # The compiled dequantizer takes 4-bit weights only: an 8-bit lm_head is kept dequantized.
    lm_head_compiled = (recipe.quantization.mode.startswith("w4") and size.vocab_table >= MIN_WEIGHTS
                        and recipe.quantization.lm_head == "w4")
    read_by_products = weights - _compiled_weights(recipe, spec) - size.vocab_table * (size.tables - 1)
    read_by_products -= size.vocab_table if lm_head_compiled else 0
    mode = recipe.quantization.mode
    per_weight = 4 if mode in ("f32", "w4f16", "w8f16") else 2  # an f16 dequantizer's weights stay float32
    levels = _compiled_weights(recipe, spec) + (size.vocab_table if lm_head_compiled else 0)
    return min(per_weight * read_by_products + levels / 2, cache)


def _origin(recipe: Recipe) -> str:
    """Where the layer's weights come from: "rtn" (rounded in the build), "levels" (a quantized
    checkpoint, downloaded or written by the quantize step) or "float"."""
    origin = recipe.quantization.origin
    return "rtn" if origin == "rtn" else "float" if origin == "float" else "levels"


# Bytes per weight of one layer at a job's peak.
COMPILE_BYTES = {"rtn": 7.0, "levels": 2.0, "float": 8.0}  # rounding's f32 temporaries; unpacked levels
CHECK_BYTES = {  # (on the host path, on the simulated device)
    "rtn": (16.0, 16.0),  # the rounding's temporaries are the peak either way
    "levels": (11.5, 5.5),  # levels, TopOp's dequantized f32, the host's dequantized f32 (the device: slices)
    "float": (8.0, 4.5),  # TopOp's f32, the host's decoded f32
}


def step_resources(recipe: Recipe, spec: ModelSpec, step: str, faithful: bool = False) -> Resources:
    """`faithful`: a check job whose layers include one the simulated device checks (verify/layer_check)."""
    size = model_size(spec)
    L, S = recipe.stages.prefill_length, recipe.stages.seq_length
    T = 2 * recipe.verify.check_tokens + 1  # reference tokens
    origin = _origin(recipe)
    weights = size.layer * size.layers + size.vocab_table * size.tables
    billions = weights / 1e9
    table = 4 * size.vocab_table  # one vocabulary table in float32
    if step == "layer":
        mb = BASE_MB["compile"] + COMPILE_BYTES[origin] * size.layer / MB
        minutes = 2 + billions * 2
    elif step == "check":
        per_weight = CHECK_BYTES[origin][1 if faithful else 0]
        if origin == "levels" and not faithful:  # the host keeps no float32 copy of what it dequantizes compiled
            compiled = _compiled_weights(recipe, spec) / size.layers
            per_weight -= 4 * compiled / size.layer
        # Live values at full rows (products and row-local ops compute the real rows and leave the padding
        # rows unmapped, numerics/lazy_zeros.py, but the device's static nets and a few whole-shape results
        # stay) and the attention mask with its rounded copies: fitted to the 1.5B's checks at seq 2048 and
        # 8192 (799 and 2837 MB measured, docs/performance.md).
        activations = 4 * L * (size.hidden + size.intermediate) + 15 * L * (S + L)
        mb = BASE_MB["check"] + (per_weight * size.layer + activations) / MB
        minutes = 2 + billions * 3
    elif step == "head":
        # Tables converted and written in blocks when large; a small one decoded whole, with its encoded copy
        # and that copy's bytes (SmolLM2's tied table: 309 MB measured against 288 declared at 1x).
        mb = BASE_MB["compile"] + (2 * table if table <= 4 * TABLE_BLOCK else 3 * TABLE_BLOCK) / MB
        mb += 3 * table / MB if recipe.quantization.lm_head not in (None, "float") else 0
        minutes = 2 + billions * 2
    elif step == "head_check":
        # TopOp's lm_head and the device's, each a block (or the whole small table) at a time, and what grows
        # with the table beyond the blocks: fitted to the measured peaks (Qwen2-7B 1412 MB, the 1.5B 316-630,
        # SmolLM2 70-392; docs/performance.md), which vary by a factor of 2 between runs.
        mb = BASE_MB["check"] + 100 + 0.6 * table / MB
        mb += 3 * table / MB if recipe.quantization.lm_head not in (None, "float") else 0
        minutes = 2 + billions * 2
    elif step == "reference":
        # transformers streaming layers: the resident layers, the cached levels of quantized layers, the
        # layer being made and its reads, T tokens' activations and their logits.
        budget = reference_memory.levels_budget(size.layer)
        levels = 0 if origin == "float" else min(budget, 1.1 * size.layer * size.layers)
        layers = reference_memory.layer_cache_budget(4 * size.layer * size.layers)
        work = 2.6 * 4 * size.layer + 4 * T * (4 * (size.hidden + size.intermediate) + size.vocab)
        mb = BASE_MB["torch"] + (layers + levels + work) / MB + 100
        minutes = 5 + billions * 20
    elif step == "e2e":
        # The host path: what it keeps decoded (up to its cache), 10% more for the tiles decoded as they are
        # used, the quantized weights' scales (float32) and zero points, the KV cache (float32) and a
        # prefill's rows, and the runtime's LLVM (the compiled one-row product, BASE_MB). Fitted to the e2e
        # jobs of the 1.5B, Qwen2.5-7B AWQ, Llama-3-8B and SmolLM2 bf16 (docs/performance.md).
        tower = tower_weights(recipe, spec.hidden_size)
        decoded = _host_kept_bytes(recipe, spec, HOST_CACHE if tower is None else VLM_HOST_CACHE)
        quantized = size.layer * size.layers if recipe.quantization.mode.startswith("w") else 0
        groups = 5 * quantized / max(1, recipe.quantization.group_size or 128)
        kv = 2 * 4 * size.layers * S * size.kv_width
        rows = 8 * L * (size.hidden + size.intermediate)
        mb = BASE_MB["runtime"] + (1.15 * decoded + groups + kv + rows) / MB
        minutes = 5 + billions * 15
        if tower is not None:
            # The family's reference streamed in the same process (InternVL's: families/internvl/stream.py):
            # torch, a decoder layer with its rounding's temporaries, a tower layer and a tile's activations;
            # the binary's image run decodes the vit net's weights tile by tile (no cache of its own).
            work = 2.6 * 4 * size.layer + 4 * tower.layer + VISION_TILE_BYTES * tower.activations
            mb += BASE_MB["torch"] + (work + 0.8 * tower.held) / MB  # the vit net's run on the host path
            minutes += tower.weights / 1e9 * VISION_MINUTES
    elif step == "vision":
        tower = tower_weights(recipe, spec.hidden_size)
        if tower is None:  # a family whose tower this formula does not know (MiniCPM-V): the tiny models' figure
            mb, minutes = BASE_MB["torch"] + 800, 10
        else:
            # torch, the tower built from its config, torch.onnx's export and the import: 1.1 GB for the tiny
            # InternVL; a real tower's weights at VISION_BYTES a weight (float32 module, export, TopOp weights,
            # the device image) and its tile's activations (VISION_TILE_BYTES a token and width).
            mb = BASE_MB["torch"] + 800 + (VISION_BYTES * tower.weights + VISION_TILE_BYTES * tower.activations) / MB
            minutes = 2 + tower.weights / 1e9 * VISION_MINUTES
    elif step == "link":
        # 16 MB reads and the programs decoded one at a time, which grow with the prefill's row tiles:
        # measured 77-101 MB (SmolLM2, 512 rows), 110-123 (the 7B, the 1.5B at 2048), 319 (the 1.5B at 8192).
        mb = 120 + 0.04 * L
        minutes = 2 + billions
    elif step == "quantize":
        # The library (gptqmodel, autoawq, auto-round) loads the whole float model, in float32 by default
        # (quant/methods: the unquantized tensors keep their values), then quantizes layer by layer:
        # 4 bytes a weight plus torch. Measured: SmolLM2-135M GPTQ 1.26-1.30 GB, 67-90 s on 2 cores. A
        # 7B in float32 is a 32 GB node's job, which is what a cluster profile should ask for.
        bytes_per_weight = 2 if recipe.quantization.options.get("dtype") in ("bfloat16", "float16") else 4
        mb = 800 + bytes_per_weight * 1.05 * weights / MB
        minutes = 5 + 20 * billions  # ~10 CPU-minutes a billion weights (32 calibration samples), twice
    elif step == "prepare":  # headers, a scan of every tensor for non-finite values in blocks, the tokenizer
        mb = BASE_MB["light"] + 70  # Qwen2-7B GPTQ: 169 MB measured
        minutes = 2
    else:  # plan, verify: headers and JSON
        mb = BASE_MB["light"]
        minutes = 2
    return Resources(int(math.ceil(mb)), int(math.ceil(minutes)))


# The vendor's tools, measured at DeepSeek-R1-Distill-Qwen-1.5B's shape (docs/bmodel.md): a w4 block net
# 0.40 GB. A vocabulary net's largest step is the code generator: about four copies of the table as the net
# stores it when the table is one weight (Qwen2-7B's 152064 x 3584 lm_head in bf16: 4.32 GB, its table
# 1.09 GB), about three when it is given in parts (the 1.5B's tables, 0.47 GB: 1.89 GB whole, 1.44 GB in 2,
# 4 or 16 parts, lm_head and embedding alike). Its lowering holds the table once, declared in 16 bits
# (top_export's `table_storage`).
VENDOR_BASE_MB = 400
VOCAB_NET_COPIES = {1: 4.1, 2: 3.1}
CMODEL_BASE_MB = 1500  # the vendor's simulator and runtime, beside the binary its device memory holds
# What one job of a build may use: the largest single job of a 7B build on a 24 GiB machine, so that several
# run beside each other.
JOB_LIMIT_MB = 4096


def vocab_table_parts(recipe: Recipe, spec: ModelSpec) -> int:
    """How many weights a vocabulary net's table is given to the vendor as: one (the bmodel `llm_convert`
    makes) unless its code generator would then pass the job limit; two after that (no fewer copies in more)."""
    return 1 if _vocab_net_mb(recipe, spec, 1) <= JOB_LIMIT_MB else 2


def _vocab_net_mb(recipe: Recipe, spec: ModelSpec, parts: int) -> float:
    element = 4 if recipe.quantization.mode == "f32" else 2
    return VENDOR_BASE_MB + VOCAB_NET_COPIES[parts] * element * model_size(spec).vocab_table / MB


def bmodel_resources(recipe: Recipe, spec: ModelSpec, job: str, net: str = "") -> Resources:
    """`job`: `net` (export and compile one net; `net` names it), `combine` or `check` (the cmodel run)."""
    size = model_size(spec)
    origin = _origin(recipe)
    billions = (size.layer * size.layers + size.vocab_table * size.tables) / 1e9
    if job == "net":
        if net == VIT_NET:
            # The vision step's export and import of the tower, then its float32 npz for tpuc-opt.
            vision = step_resources(recipe, spec, "vision")
            tower = tower_weights(recipe, spec.hidden_size)
            mb = VENDOR_BASE_MB + vision.mem_mb + (2 * 4 * tower.weights / MB if tower else 0)
            return Resources(int(mb), vision.runtime_min + 2)
        if net.startswith("block"):
            # The layer's TopOp weights (rounded in the job, or levels read), their float32 npz, the tpu npz.
            mb = VENDOR_BASE_MB + (COMPILE_BYTES[origin] + 6) * size.layer / MB
            minutes = 2 + billions
        else:
            mb = _vocab_net_mb(recipe, spec, vocab_table_parts(recipe, spec))
            minutes = 2 + billions
    elif job == "combine":
        # The streamed combine (bmodel/combine.py) holds the parts' descriptions and a 16 MiB copy buffer
        # (the 1.5B's final combine: 85 MB); its time is the copy of what it writes.
        mb = 300
        minutes = 2 + billions
    else:
        # `net`: the part checked (head, layer_I), or "" for the final check. The cmodel's device memory holds
        # the binary it loads (the part's, or the whole one's) and the tiny recipes' activations.
        if net == "head":
            mb = CMODEL_BASE_MB + _stored_tables_bytes(size) / MB
        elif net == "lm_head":
            mb = CMODEL_BASE_MB + 2 * size.vocab_table / MB  # lm_head's twin: its table, 16-bit
        elif net.startswith("layer_"):
            mb = CMODEL_BASE_MB + _stored_layer_bytes(recipe, size) / MB
        else:
            mb = _whole_binary_check_mb(recipe, spec) if final_check_loads_binary(recipe, spec) else \
                BASE_MB["light"] + 300  # the binary's nets read and hashed in 16 MiB chunks
        minutes = 10 + billions * 20
    return Resources(int(mb), int(math.ceil(minutes)))



def final_check_loads_binary(recipe: Recipe, spec: ModelSpec) -> bool:
    """Whether the final bmodel check loads the whole binary into the cmodel (whose device memory is host
    memory: a 7B's 5.35 GB binary needs 5.6 GB): where that fits a job. Beyond, its nets' bytes are shown to
    be the ones the part checks ran (verify/bmodel_checks.py)."""
    return _whole_binary_check_mb(recipe, spec) <= JOB_LIMIT_MB


def _whole_binary_check_mb(recipe: Recipe, spec: ModelSpec) -> float:
    size = model_size(spec)
    return CMODEL_BASE_MB + (_stored_layer_bytes(recipe, size) * size.layers + _stored_tables_bytes(size)) / MB


def _stored_layer_bytes(recipe: Recipe, size: ModelSize) -> float:
    return size.layer * (0.6 if recipe.quantization.mode.startswith("w4") else 2.1)


def _stored_tables_bytes(size: ModelSize) -> float:
    return 2 * size.vocab_table * size.tables  # the head's tables, 16-bit

"""The typed form of a recipe, and the one definition of the recipe schema's fields: their names, types and
defaults (a section is a class, a field its attribute). `llmbuild.recipe.schema_table` adds each field's words
and constraints (one row per field, a test keeps the rows and these classes the same set) and renders
docs/recipe.md; `llmbuild.recipe.load_recipe` validates YAML against both and builds these classes.

`None` as a default means absent: the loader fills what it stands for (a tolerance from the mode's error
budget, the chip's memory, ...), as the field's row says. Attributes marked `LOADER` are not in recipe files:
the loader sets them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

SourceKind = Literal["synthetic", "hf", "gguf"]
LOADER = {"recipe_file": False}  # field metadata: set by the loader, not a recipe field
FLOAT_MODES = ("f32", "bf16", "f16")
# Weight-only quantized modes: 4- or 8-bit weights in groups with scales and zero points, bf16/f16
# activations.
QUANT_MODES = ("w4bf16", "w4f16", "w8bf16", "w8f16")
MODES = FLOAT_MODES + QUANT_MODES
# `auto`: the checkpoint's own quantization (bits from its quantization_config, bf16 activations).
MODE_CHOICES = MODES + ("auto",)
DEFAULT_GROUP_SIZE = 64
# How w4/w8 weights come to be. `auto`: imported from a quantized checkpoint, else round-to-nearest.
# gptq / awq / autoround run the library of that name in the build's `quantize` step.
LIBRARY_METHODS = ("gptq", "awq", "autoround")
METHODS = ("auto", "rtn") + LIBRARY_METHODS
LM_HEAD_CHOICES = ("float", "w8", "w4")
DEFAULT_CALIBRATION = "calibration/english.txt"  # inside llmbuild/data


@dataclass(frozen=True)
class SourceConfig:
    kind: SourceKind
    # hf: a checkpoint directory; gguf: a .gguf file. Templated strings are already rendered.
    path: str | None = None
    # gguf shipped inside a Python package (found with importlib.util.find_spec, never imported).
    package: str | None = None
    file: str | None = None
    # synthetic: HF-style config.json fields (model_type, hidden_size, ...) and the RNG seed.
    config: dict[str, Any] | None = None
    seed: int = 0
    # hf: a config.json shipped with the recipe (absolute once loaded), read when `path` is absent.
    config_file: str | None = None


@dataclass(frozen=True)
class QuantConfig:
    mode: str = "f32"  # one of MODES once loaded (`auto` is resolved from the checkpoint)
    group_size: int = DEFAULT_GROUP_SIZE  # weights per scale/zero point along K in w4/w8 modes; -1: per channel
    method: str = "auto"  # one of METHODS
    sym: bool = True  # library methods: symmetric levels (zero point fixed at the middle)
    desc_act: bool = False  # gptq: quantize columns in activation order (act order, a g_idx)
    calibration: str | None = None  # library methods: a text file (absolute once loaded)
    calibration_samples: int = 32
    calibration_length: int = 128
    options: dict[str, Any] = field(default_factory=dict)  # library knobs (validated by the method)
    lm_head: str = "float"  # float | w8 | w4: round-to-nearest lm_head (and the tied embedding table)
    # Filled by the loader from the source's config.json when the checkpoint is already quantized.
    checkpoint: CheckpointQuant | None = field(default=None, metadata=LOADER)

    @property
    def origin(self) -> str:
        """Where w4/w8 weights come from: float (no quantization), rtn, checkpoint, or a library method."""
        if not self.mode.startswith("w"):
            return "float"
        if self.checkpoint is not None:
            return "checkpoint"
        return "rtn" if self.method in ("auto", "rtn") else self.method


@dataclass(frozen=True)
class CheckpointQuant:
    """What a quantized source checkpoint says about itself (its config.json quantization_config)."""

    method: str  # gptq, awq, auto-round, compressed-tensors
    bits: int
    group_size: int  # -1: per channel
    sym: bool
    desc_act: bool


@dataclass(frozen=True)
class TargetConfig:
    chip: str = "bm1684x"
    device_memory_bytes: int | None = None  # None: the chip file's board default


# Chips TPU-MLIR's own code generator targets: a recipe for one of them builds a .bmodel by default.
VENDOR_CHIPS = ("bm1684x", "bm1688")


@dataclass(frozen=True)
class BmodelConfig:
    build: bool | None = None  # None: where the vendor supports the chip (builds_bmodel)
    history: bool = False  # block_kv_i and dynamic prefill nets (LLM-TPU's multi-turn form)
    cores: int = 1


def builds_bmodel(recipe: Recipe) -> bool:
    """Whether the recipe's build makes the vendor's .bmodel beside the .llmb: by default where the vendor
    supports the chip (the loader makes the default false for a vision family whose vit net has no vendor
    form: recipe/loader.py)."""
    chosen = recipe.bmodel.build
    if chosen is None:
        return recipe.target.chip in VENDOR_CHIPS
    return chosen


@dataclass(frozen=True)
class VisionConfig:
    family: str | None = None  # how the tower and projector are defined; None (no tower): Recipe.vision is None
    exporter: str = "legacy"  # torch.onnx exporter: legacy | dynamo
    config: dict[str, Any] | None = None  # synthetic: the vision-language config.json fields
    image_cosine: float | None = None  # the vision net's features against transformers (absent: the mode's)
    max_tiles: int = 1  # InternVL's dynamic tiling (a thumbnail added when an image takes several tiles)


@dataclass(frozen=True)
class StagesConfig:
    seq_length: int  # S: KV-cache capacity
    prefill_length: int  # L: tokens per prefill / prefill_kv call


@dataclass(frozen=True)
class VerifyConfig:
    # Tolerances: a recipe's own, else the loader fills the mode's error budget (llmbuild/recipe/tolerances.py):
    # never None in a loaded recipe.
    # top (numpy interpretation of TopOp) against transformers, per layer and stage
    top_cosine: float | None = None
    top_euclid: float | None = None
    # tpu (mode arithmetic) against top, per layer, stage and op
    tpu_cosine: float | None = None
    tpu_euclid: float | None = None
    # end to end: greedy tokens against transformers generate
    prompt_ids: tuple[int, ...] | None = None  # default: derived from the prompt or fixed ids
    prompt: str | None = None  # a chat message; the chat template is applied
    max_new_tokens: int = 16
    check_tokens: int = 64  # real tokens per prefill / prefill_kv stage check
    exact_tokens: bool = True  # require identical greedy ids (f32); else only logits_cosine
    logits_cosine: float | None = None  # every teacher-forced step's logits against transformers'


@dataclass(frozen=True, kw_only=True)
class Recipe:
    name: str = field(metadata=LOADER)  # the file stem; also the Snakemake target
    path: Path = field(metadata=LOADER)
    description: str = ""
    build: bool = True  # false: for `llmbuild estimate` only; `snakemake all` skips it
    architecture: str
    source: SourceConfig
    quantization: QuantConfig = field(default_factory=QuantConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    stages: StagesConfig
    vision: VisionConfig | None = None  # a vision-language model's tower (the `vit` net); None: a text model
    bmodel: BmodelConfig = field(default_factory=BmodelConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    # The validated mapping, sections as plain data: used for per-section digests (Snakemake params).
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False, metadata=LOADER)

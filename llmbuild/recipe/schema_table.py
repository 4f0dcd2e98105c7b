"""The recipe schema as a table of data: one row per field, read by the loader and by the docs.

The fields' names, types and defaults are the attributes of llmbuild/recipe_types.py's classes (`typed()`
reads them); each row here adds the words and the constraints. The loader validates every recipe against
`FIELDS` (types, required/default, enum choices, ranges, which `source.kind` a field belongs to); rules that
tie several fields together are listed in `RULES` and checked in `llmbuild.recipe.loader`. `schema_markdown()`
renders the same rows for docs/recipe.md, and a test keeps the two identical, so the doc cannot drift from the
checks; another keeps the rows and the classes the same set of fields.

Regenerate the table in the docs with
``python -c 'from llmbuild.recipe.schema_table import update_doc; update_doc("docs/recipe.md")'``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmbuild.frontend.torch_onnx_export import EXPORTERS
from llmbuild.recipe_types import DEFAULT_CALIBRATION, LM_HEAD_CHOICES, METHODS, MODE_CHOICES, Recipe

SOURCE_KINDS = ("synthetic", "hf", "gguf")


def vision_families() -> list[str]:
    """The vision-language families in the registry, imported lazily so loading a recipe stays cheap."""
    from llmbuild.families.registry import VISION_LANGUAGE, known_families

    return known_families(VISION_LANGUAGE)


def architectures() -> list[str]:
    """The decoder families' names in the registry, imported lazily so loading a recipe stays cheap."""
    from llmbuild.families.registry import known_families

    return known_families()


def chips() -> list[str]:
    from llmbuild.chips import known_chips

    return known_chips()


# ---------------------------------------------------------------------------------------------
# Constraints: each checks a value of the right type and says, in words, what it expects.


@dataclass(frozen=True)
class OneOf:
    choices: Callable[[], Sequence[str]]

    def expected(self) -> str:
        return "one of " + ", ".join(self.choices())

    def ok(self, value: Any) -> bool:
        return value in self.choices()


@dataclass(frozen=True)
class Positive:
    def expected(self) -> str:
        return "> 0"

    def ok(self, value: Any) -> bool:
        return value > 0


@dataclass(frozen=True)
class NonNegative:
    def expected(self) -> str:
        return ">= 0"

    def ok(self, value: Any) -> bool:
        return value >= 0


@dataclass(frozen=True)
class GroupSize:
    """A quantization group: a positive count of weights, or -1 for one group per output channel."""

    def expected(self) -> str:
        return "> 0, or -1 (per channel)"

    def ok(self, value: Any) -> bool:
        return value > 0 or value == -1


@dataclass(frozen=True)
class UnitInterval:
    """Tolerances are similarity scores: 0 would accept anything, above 1 nothing."""

    def expected(self) -> str:
        return "in (0, 1]"

    def ok(self, value: Any) -> bool:
        return 0 < value <= 1


@dataclass(frozen=True)
class NonEmptyIds:
    def expected(self) -> str:
        return "with at least one id, each >= 0"

    def ok(self, value: Any) -> bool:
        return len(value) > 0 and all(v >= 0 for v in value)


Constraint = OneOf | Positive | NonNegative | GroupSize | UnitInterval | NonEmptyIds


# ---------------------------------------------------------------------------------------------
# Types: the words used in docs and errors, and the Python check behind each.

TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "mapping": "a mapping",
    "section": "a mapping",
    "list[int]": "a list of integers",
}


def type_ok(type_: str, value: Any) -> bool:
    # bool is a subclass of int in Python; YAML `true` is never a size.
    if type_ == "string":
        return isinstance(value, str)
    if type_ == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_ == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if type_ == "boolean":
        return isinstance(value, bool)
    if type_ in ("mapping", "section"):
        return isinstance(value, dict)
    if type_ == "list[int]":
        return isinstance(value, list) and all(type_ok("integer", v) for v in value)
    raise AssertionError(f"unknown schema type {type_!r}")


_NO_DEFAULT = object()
_DIRECTIVE_TYPES = {"base": "string"}  # read while the files are merged; not a field of Recipe


@dataclass(frozen=True)
class FieldSpec:
    """One row: a field's words and constraints. Its type, default and whether it is required come from
    its attribute in llmbuild/recipe_types.py (`typed()`), the one place they are defined."""

    path: str  # dotted, e.g. "stages.seq_length"; a section's row groups the rows under it
    description: str
    constraint: Constraint | None = None
    kinds: tuple[str, ...] | None = None  # source.kind values the field applies to (None: all)
    required_for: tuple[str, ...] = ()  # source.kind values for which the field is required
    note: str = ""  # a constraint checked by a cross-field rule, for the docs

    @property
    def type(self) -> str:  # a key of TYPE_WORDS
        return typed()[self.path][0]

    @property
    def default(self) -> Any:  # filled into Recipe.raw when the field is absent (a section: {})
        return typed()[self.path][1]

    @property
    def has_default(self) -> bool:
        return self.default is not _NO_DEFAULT

    @property
    def required(self) -> bool:
        return not self.has_default and self.path not in _DIRECTIVE_TYPES

    @property
    def parent(self) -> str:
        return self.path.rpartition(".")[0]

    @property
    def key(self) -> str:
        return self.path.rpartition(".")[2]

    def expected(self) -> str:
        """What a value must be, in words: 'a positive integer', 'one of f32, bf16, f16', ..."""
        words = TYPE_WORDS[self.type]
        if self.constraint is None:
            return words
        if isinstance(self.constraint, OneOf):
            return self.constraint.expected()
        return f"{words} {self.constraint.expected()}"


@functools.cache
def typed() -> dict[str, tuple[str, Any]]:
    """Every recipe field by dotted path: its type word and its default (_NO_DEFAULT: required), read from
    the classes of llmbuild/recipe_types.py. A section's default is {} when each of its fields has one."""
    out: dict[str, tuple[str, Any]] = {path: (word, _NO_DEFAULT) for path, word in _DIRECTIVE_TYPES.items()}
    _walk(Recipe, "", out)
    return out


def _walk(cls: type, prefix: str, out: dict[str, tuple[str, Any]]) -> bool:
    """Adds `cls`'s recipe fields under `prefix`; True when every one of them has a default."""
    all_defaults = True
    for f, hint in _recipe_fields(cls):
        path = prefix + f.name
        if dataclasses.is_dataclass(hint):
            complete = _walk(hint, path + ".", out)
            out[path] = ("section", {} if complete else _NO_DEFAULT)
        else:
            default = f.default if f.default is not dataclasses.MISSING else \
                f.default_factory() if f.default_factory is not dataclasses.MISSING else _NO_DEFAULT
            out[path] = (_type_word(hint, path), default)
        all_defaults = all_defaults and out[path][1] is not _NO_DEFAULT
    return all_defaults


def build_section(cls: type, values: dict[str, Any], **computed: Any) -> Any:
    """An instance of `cls` (a recipe_types class) from its validated section: each recipe field as checked
    (mappings copied, id lists as tuples, a section built the same way), then what the loader computed."""
    kwargs: dict[str, Any] = {}
    for f, hint in _recipe_fields(cls):
        if f.name in computed:
            continue
        value = values[f.name]
        if dataclasses.is_dataclass(hint):
            value = build_section(hint, value)
        elif isinstance(value, dict):
            value = copy.deepcopy(value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs, **computed)


@functools.cache
def _recipe_fields(cls: type) -> tuple[tuple[dataclasses.Field, Any], ...]:
    """`cls`'s fields that recipe files set (not those marked LOADER), each with its type, `None` aside."""
    hints = typing.get_type_hints(cls)
    return tuple((f, _without_none(hints[f.name])) for f in dataclasses.fields(cls)
                 if f.metadata.get("recipe_file", True))


def _without_none(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if isinstance(hint, types.UnionType) and len(args) == 1 else hint


def _type_word(hint: Any, path: str) -> str:
    origin = typing.get_origin(hint)
    if hint is str or origin is typing.Literal:
        return "string"
    if hint is bool:
        return "boolean"
    if hint is int:
        return "integer"
    if hint is float:
        return "number"
    if hint is dict or origin is dict:
        return "mapping"
    if origin is tuple and typing.get_args(hint) == (int, ...):
        return "list[int]"
    raise AssertionError(f"recipe field {path}: no schema type for {hint!r}")


_TOL = UnitInterval()
# Absent tolerances come from llmbuild/recipe/tolerances.py: an error budget of the activation dtype and depth.
_PER_MODE = "Absent: the error budget of the mode's activation dtype and the model's depth (docs/verification.md)."

FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("base",
              "Name of a recipe in the same directory whose fields this one inherits (deep merge: "
              "mappings merge key by key, anything else replaces). Conventionally a file starting "
              "with `_`, e.g. `_tiny_common`. Not templated."),
    FieldSpec("description", "One line saying what the recipe builds."),
    FieldSpec("build",
              "`false`: the recipe is for `llmbuild estimate` only (no checkpoint yet, or a mode the "
              "compiler does not build); `list_recipes(buildable_only=True)`, and so `snakemake all`, "
              "skip it."),
    FieldSpec("architecture",
              "Decoder architecture in the family registry. The checkpoint decides how the model is imported "
              "(its config.json's `model_type`, or a GGUF file's `general.architecture`); this field states it, "
              "and the loader checks that the two agree.", constraint=OneOf(architectures),
              note="must be the checkpoint's architecture"),
    FieldSpec("source", "Where the weights come from."),
    FieldSpec("source.kind",
              "`synthetic`: random weights from a config (tests); `hf`: a Hugging Face checkpoint "
              "directory; `gguf`: a GGUF file.", constraint=OneOf(lambda: SOURCE_KINDS)),
    FieldSpec("source.path",
              "hf: the checkpoint directory (with config.json); gguf: the .gguf file. Relative paths "
              "are relative to the recipe file; `~` is expanded.",
              kinds=("hf", "gguf"), required_for=("hf",),
              note="must exist; gguf: give `path` or `package` + `file`, not both"),
    FieldSpec("source.package",
              "gguf: an installed Python package that ships the file (located without importing it).",
              kinds=("gguf",), note="must be installed; needs `file`"),
    FieldSpec("source.file", "gguf: the file name inside `package`.",
              kinds=("gguf",), note="must exist inside `package`; needs `package`"),
    FieldSpec("source.config",
              "synthetic: Hugging Face config.json fields (`model_type`, `hidden_size`, ...).",
              kinds=("synthetic",), required_for=("synthetic",),
              note="must contain `model_type` (a string)"),
    FieldSpec("source.seed", "synthetic: seed of the random weights.",
              constraint=NonNegative(), kinds=("synthetic",)),
    FieldSpec("source.config_file",
              "hf: a config.json shipped with the recipe, read instead of the checkpoint's when the "
              "checkpoint directory is absent (enough for `llmbuild estimate`). Relative to the recipe file.",
              kinds=("hf",), note="must exist"),
    FieldSpec("quantization", "How weights and activations are stored."),
    FieldSpec("quantization.mode",
              "Number format of weights and arithmetic: `f32`, `bf16`, `f16`, or weight-only quantized "
              "`w4bf16`, `w4f16`, `w8bf16`, `w8f16` (4/8-bit weights with per-group scales and zero points, "
              "bf16/f16 activations), or `auto`: the quantized checkpoint's own bits with bf16 activations. "
              "`quantization: auto` is short for `quantization: {mode: auto}`.", constraint=OneOf(lambda: MODE_CHOICES),
              note="`auto` needs an hf source whose config.json has `quantization_config`"),
    FieldSpec("quantization.group_size",
              "w4/w8 modes: weights per scale and zero point along the input dimension; ignored by "
              "float modes. Round-to-nearest w8 is per channel whatever this says (the incumbent's "
              "choice). An imported checkpoint brings its own.", constraint=GroupSize(),
              note="with a quantized checkpoint: absent, or equal to the checkpoint's"),
    FieldSpec("quantization.method",
              "How w4/w8 weights are made: `auto` (import a quantized checkpoint as it is; a float one is "
              "rounded to nearest), `rtn`, or in the build's `quantize` step through a library: `gptq` "
              "(gptqmodel), `awq` (autoawq), `autoround` (auto-round).", constraint=OneOf(lambda: METHODS),
              note="gptq/awq/autoround/rtn need a float checkpoint and a w4/w8 mode"),
    FieldSpec("quantization.sym",
              "gptq/awq/autoround: symmetric levels (zero point in the middle) instead of a fitted zero "
              "point per group."),
    FieldSpec("quantization.desc_act",
              "gptq: quantize input columns in order of decreasing activation (act order); the "
              "checkpoint then carries a g_idx and the compiler permutes activations to match."),
    FieldSpec("quantization.calibration",
              "gptq/awq/autoround: a text file of calibration data. Relative to the recipe file; absent: "
              f"the text that ships in llmbuild/data/{DEFAULT_CALIBRATION}.",
              note="must exist"),
    FieldSpec("quantization.calibration_samples",
              "gptq/awq/autoround: number of calibration windows cut from the text.",
              constraint=Positive()),
    FieldSpec("quantization.calibration_length",
              "gptq/awq/autoround: tokens per calibration window (32 x 128 tokens fit the shipped text, "
              "about 6k tokens with SmolLM2's tokenizer).", constraint=Positive()),
    FieldSpec("quantization.options",
              "gptq/awq/autoround: the library's own knobs, checked by name and type (e.g. `{iters: 50}` "
              "for autoround, `{damp_percent: 0.01}` for gptq; llmbuild/quant/methods/ lists them)."),
    FieldSpec("quantization.lm_head",
              "w4/w8 modes: `float` keeps lm_head in the activation type (the incumbent's choice); `w8` "
              "(per channel) or `w4` (groups of `group_size`) rounds it to nearest. With tied embeddings "
              "the embedding table is the same stored weight, looked up by `A16Gather`.",
              constraint=OneOf(lambda: LM_HEAD_CHOICES), note="w8/w4 need a w4/w8 mode"),
    FieldSpec("target", "The chip to compile for."),
    FieldSpec("target.chip", "A chip described in llmbuild/chips/data/.", constraint=OneOf(chips)),
    FieldSpec("target.device_memory_bytes",
              "Device memory the model may use, in bytes. Absent: the chip file's board default "
              "(bm1684x 12 GiB). `llmbuild estimate` and the build's memory check compare the model with it.",
              constraint=Positive()),
    FieldSpec("stages", "Shapes of the compiled stages."),
    FieldSpec("stages.seq_length", "S: KV-cache capacity in tokens.",
              constraint=Positive()),
    FieldSpec("stages.prefill_length", "L: tokens per prefill call.",
              constraint=Positive(), note="<= `stages.seq_length`"),
    FieldSpec("vision", "The vision tower of a vision-language model (absent: a text model)."),
    FieldSpec("vision.family",
              "How the tower and its projector are defined: `internvl` (transformers' native InternVL: "
              "InternViT, pixel shuffle, MLP projector) or `minicpmv` (MiniCPM-V 2.6: SigLIP and the "
              "resampler, one static net for slices of any size; slicing from config.json's `slice_config`) or "
              "`minicpmv4_6` (MiniCPM-V 4.6, transformers' native `minicpmv4_6`: SigLIP with a window-attention "
              "merger and a 2x2 merger, one static net for slices of any size, h*w/16 rows each; the Qwen3.5 "
              "text model). "
              "Absent: no vision net.", constraint=OneOf(vision_families)),
    FieldSpec("vision.exporter",
              "torch.onnx exporter of the tower: `legacy` (tracing, opset 17: runs the tower at the net's size) "
              "or `dynamo` (torch.export on fake tensors, opset 18: the real-size recipes', a smaller peak).",
              constraint=OneOf(lambda: EXPORTERS)),
    FieldSpec("vision.config",
              "synthetic: the vision-language config.json fields besides the text model's "
              "(`vision_config`, `downsample_ratio`, ...; MiniCPM-V: `vision_config`, `query_num`, "
              "`slice_config`); the text model is `source.config`.",
              note="needs `vision.family`; synthetic sources only"),
    FieldSpec("vision.max_tiles",
              "InternVL's dynamic tiling: an image is cut into up to this many tiles of the tower's size (the "
              "grid closest to its aspect ratio), plus a thumbnail of the whole when there are several; 1: the "
              "image resized to one tile. The vit net runs once per tile (MiniCPM-V slices by its "
              "config.json's `slice_config.max_slice_nums` instead).", constraint=Positive()),
    FieldSpec("vision.image_cosine",
              "Cosine similarity of the compiled vision net's image features against the reference "
              "(transformers; MiniCPM-V: its tower and resampler at each checked piece's own size). "
              "Absent: the error budget of the activation dtype over a tower's depth, like the logits' "
              "(llmbuild/recipe/tolerances.py): 0.9999995 in f32, 0.9944 in bf16.", constraint=_TOL),
    FieldSpec("bmodel", "The vendor's deployable `.bmodel`, built beside the `.llmb` by TPU-MLIR's own "
              "lowering and code generation (docs/bmodel.md)."),
    FieldSpec("bmodel.build",
              "Build it (a vision-language model's with its `vit` net). Absent: where TPU-MLIR supports "
              "`target.chip` (bm1684x, bm1688) and the model's family has a vendor form.",
              note="true needs a chip TPU-MLIR supports and a family with a vendor form"),
    FieldSpec("bmodel.history",
              "Add `block_kv_i` (prefill on top of a kept KV cache) in the form LLM-TPU's runtime drives for a "
              "multi-turn conversation (`llm_convert --use_history_kv`): prefill nets with dynamic lengths and "
              "no mask input. False: static prefill with a mask input, `llm_convert`'s default.",
              note="true needs a 16-bit mode (the vendor's fused attention has no f32 form)"),
    FieldSpec("bmodel.cores", "Cores each net runs on: 1, or 2 on the BM1688.",
              constraint=OneOf(lambda: [1, 2]), note="2 needs bm1688"),
    FieldSpec("verify", "Acceptance thresholds of the verification steps."),
    FieldSpec("verify.top_cosine",
              "Cosine similarity of the numpy TOP interpretation against transformers, per layer "
              f"and stage. {_PER_MODE}", constraint=_TOL),
    FieldSpec("verify.top_euclid", f"Euclidean similarity, TOP against transformers. {_PER_MODE}", constraint=_TOL),
    FieldSpec("verify.tpu_cosine",
              f"Cosine similarity of the TPU-mode arithmetic against TOP, per layer, stage and op. {_PER_MODE}",
              constraint=_TOL),
    FieldSpec("verify.tpu_euclid", f"Euclidean similarity, TPU against TOP, per op and output. "
              f"{_PER_MODE}", constraint=_TOL),
    FieldSpec("verify.prompt_ids",
              "Token ids of the end-to-end prompt. Absent: derived from `prompt`, else fixed ids.",
              constraint=NonEmptyIds(),
              note="not with `prompt`; synthetic: each id < `source.config.vocab_size`"),
    FieldSpec("verify.prompt",
              "A chat message for the end-to-end check; the model's chat template is applied.",
              note="not with `prompt_ids`"),
    FieldSpec("verify.max_new_tokens", "Greedy tokens generated end to end.",
              constraint=Positive()),
    FieldSpec("verify.check_tokens",
              "Real tokens in each `prefill` and `prefill_kv` check (the reference runs 2 x this + 1 "
              "tokens; the rest of each L-token net is padding, computed only on the sampled layers the "
              "simulated device checks in full).", constraint=Positive()),
    FieldSpec("verify.exact_tokens",
              "Require the same greedy ids as transformers (f32); if false only `logits_cosine` "
              "is checked."),
    FieldSpec("verify.logits_cosine",
              "Cosine similarity of the logits against transformers' at every step of the teacher-forced "
              f"end-to-end run (each step fed the reference's token). {_PER_MODE}", constraint=_TOL),
)

BY_PATH: dict[str, FieldSpec] = {f.path: f for f in FIELDS}

# Rules that involve more than one field; the loader checks each of them.
RULES: tuple[str, ...] = (
    "Unknown keys are errors anywhere except inside `source.config` and `vision.config`.",
    "`vision.config` needs `vision.family` and a synthetic source.",
    "`stages.prefill_length` must not exceed `stages.seq_length`.",
    "A `source` field that does not apply to `source.kind` is an error (e.g. `config` with `hf`).",
    "`synthetic` needs `source.config` with a string `model_type`.",
    "`hf` needs `source.path`: an existing directory holding `config.json`; with an existing "
    "`source.config_file`, `load_recipe(..., require_checkpoint=False)` (what `llmbuild estimate` "
    "uses) accepts a missing checkpoint.",
    "`gguf` needs either `source.path` (an existing file) or `source.package` + `source.file` "
    "(an installed package holding that file).",
    "`verify.prompt` and `verify.prompt_ids` are mutually exclusive.",
    "`architecture` must be the architecture the checkpoint names (config.json's `model_type`, a GGUF file's "
    "`general.architecture`).",
    "For `synthetic`, every id in `verify.prompt_ids` must be below `source.config.vocab_size`.",
)


def children(section: str) -> list[FieldSpec]:
    """The rows directly under `section` ("" for the top level)."""
    return [f for f in FIELDS if f.parent == section]


def _default_words(f: FieldSpec) -> str:
    if f.required:
        return "required"
    if f.required_for:
        return "required for " + ", ".join(f.required_for)
    if not f.has_default or f.default is None:
        return "—"
    if f.type == "section":
        return "all defaults"
    if isinstance(f.default, bool):
        return f"`{str(f.default).lower()}`"
    if f.default == "":
        return '`""`'
    return f"`{f.default}`"


def _constraint_words(f: FieldSpec) -> str:
    parts = []
    if isinstance(f.constraint, OneOf):
        parts.append("one of " + ", ".join(f"`{c}`" for c in f.constraint.choices()))
    elif f.constraint is not None:
        parts.append(f.constraint.expected())
    if f.kinds is not None:
        parts.append("only for " + ", ".join(f"`{k}`" for k in f.kinds))
    if f.note:
        parts.append(f.note)
    return "; ".join(parts)


TABLE_BEGIN = "<!-- schema-table:begin (generated by schema_markdown(); do not edit) -->"
TABLE_END = "<!-- schema-table:end -->"


def schema_markdown() -> str:
    """The field table of docs/recipe.md, plus the cross-field rules, as Markdown."""
    lines = [
        "| Field | Type | Default | Meaning | Constraints |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in FIELDS:
        type_words = "mapping (section)" if f.type == "section" else f.type
        cells = [f"`{f.path}`", type_words, _default_words(f), f.description, _constraint_words(f)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", "Rules across fields:", ""]
    lines += [f"- {rule}" for rule in RULES]
    return "\n".join(lines) + "\n"


def update_doc(path: str | Path) -> bool:
    """Rewrite the generated block between the markers in `path`; True if it changed."""
    path = Path(path)
    text = path.read_text()
    head, sep1, rest = text.partition(TABLE_BEGIN + "\n")
    _, sep2, tail = rest.partition(TABLE_END)
    if not (sep1 and sep2):
        raise ValueError(f"{path}: missing the schema-table markers")
    new = head + TABLE_BEGIN + "\n" + schema_markdown() + TABLE_END + tail
    if new != text:
        path.write_text(new)
    return new != text


"""One descriptor per build step: its verb, the code and data it runs, the recipe fields it reads, its
priority and its resource ladder. The rerun digests, code digests, priorities and commands of the Snakemake
rules (steps/dag.py, rules/*.smk) are derived from these, and nothing else says what a step reads.

A step's recipe is a view that records every field read (llmbuild/recipe/reads.py); under the tests a read
the descriptor does not declare fails the step, so a declaration cannot fall behind the code. A declared
field enters the step's digest as the step sees it: the typed value after the loader's defaults (a changed
default reruns the steps that read it), paths as written (a moved project reruns nothing). Where a step
depends on a function of some fields only, a `Derived` declares those fields and hashes the function: the
reference runs the float model with the weights' levels dequantized, so of `quantization.mode` it reads the
weights' bits and not the activation type, and f32 -> bf16 does not rerun it.

The declarations were measured, not guessed: `LLMBUILD_READS_LOG=FILE snakemake ...` appends what each
step read, one JSON line a step; docs/reruns.md lists, field by field, which steps rerun.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmbuild.artifacts.paths import LM_HEAD_LOGITS_NET, VIT_NET
from llmbuild.quant.scheme import head_scheme, recipe_scheme
from llmbuild.recipe.reads import covers
from llmbuild.recipe_types import LIBRARY_METHODS, Recipe, builds_bmodel

# Fields hashed as written, not as resolved: the loader makes these absolute, and a digest must not change
# when the project moves. (What lies at a path is the step's input: the checkpoint through prepare, the
# calibration text through the quantize step's input and digest.)
AS_WRITTEN = frozenset({"source.path", "source.config_file", "quantization.calibration"})


@dataclass(frozen=True)
class Derived:
    """Fields a step reads only through `of(recipe)`: its digest hashes that value, not the fields."""

    name: str
    fields: tuple[str, ...]
    of: Callable[[Recipe], Any]
    why: str


def _imports_packed(recipe: Recipe) -> bool:
    return recipe.quantization.origin == "checkpoint"


def _rounded_weights(recipe: Recipe) -> Any:
    """How the reference's weights are rounded: the projections' scheme and lm_head's (verify/reference.py)."""
    scheme, head = recipe_scheme(recipe.quantization), head_scheme(recipe.quantization)
    return {"weights": None if scheme is None else [recipe.quantization.origin, scheme.bits, scheme.group_size,
                                                    scheme.act_order, scheme.per_channel_8bit],
            "lm_head": None if head is None else [head.bits, head.group_size]}


_CALIBRATION = ("quantization.calibration", "quantization.calibration_samples", "quantization.calibration_length",
                "quantization.options")
_QUANT_FIELDS = ("quantization.mode", "quantization.method", "quantization.group_size", "quantization.desc_act",
                 "quantization.sym", "quantization.lm_head", "quantization.checkpoint")
IMPORTS_PACKED = Derived("imports_packed", ("quantization.mode", "quantization.method", "quantization.checkpoint"),
                         _imports_packed, "prepare checks a quantized checkpoint's packed tensors, whatever the mode")
ROUNDED_WEIGHTS = Derived("rounded_weights", _QUANT_FIELDS, _rounded_weights,
                          "the float model runs on the dequantized levels; the activation type is the binary's")



def _storage(recipe: Recipe) -> Any:
    return {"mode": recipe.quantization.mode, **_rounded_weights(recipe)}


# How the compiled weights are stored: what every compile step reads of `quantization` (the library's knobs,
# sym and calibration, reach them only through the quantize step's checkpoint, an input). A float build
# ignores the group size and act order, so changing them reruns nothing there.
STORAGE_FIELDS = ("quantization.mode", "quantization.method", "quantization.group_size", "quantization.desc_act",
                  "quantization.lm_head", "quantization.checkpoint")
STORAGE = Derived("storage", STORAGE_FIELDS, _storage,
                  "the activation type and the weights' rounding; a float build ignores group size and act order")

# Which ready job Snakemake starts first (the highest), from a build's critical path on 2 cores: the
# reference (the longest job; a 7B's takes both cores, and starting the compile jobs first only delays it),
# then the end-to-end check (the longest after it) and the chain that feeds it (plan, layers, head, link),
# then the check shards, those with a layer on the simulated device (twice as long) first. Checks ahead of
# the layer jobs had starved link, and a 7B's 116 s end-to-end check then ran alone at the end.
PRIORITY_REFERENCE, PRIORITY_E2E, PRIORITY_COMPILE, PRIORITY_DEVICE_CHECKS, PRIORITY_CHECKS = 4, 3, 2, 1, 0


@dataclass(frozen=True)
class Step:
    name: str
    verb: str  # `llmbuild <verb>`
    entry: tuple[str, ...]  # the modules its command imports (their import closure is its code digest)
    reads: tuple[str, ...]  # recipe fields, dotted; a section's name covers all its fields
    derived: tuple[Derived, ...] = ()
    data: tuple[str, ...] = ()  # files and folders under the package it reads
    after: tuple[str, ...] = ()  # the steps whose outputs it reads
    # Those of them whose outputs it reads are temporary (deleted once read, to bound the disk): when this step
    # reruns, they rerun first to make them again.
    temp_from: tuple[str, ...] = ()
    priority: int = 0
    when: Callable[[Recipe], bool] | None = None  # whether a recipe's build has this step (None: every build)

    @property
    def declared(self) -> tuple[str, ...]:
        return (*self.reads, *(f for d in self.derived for f in d.fields))

    def allows(self) -> Callable[[str], bool]:
        return covers(self.declared)


def _library_quantized(recipe: Recipe) -> bool:
    return recipe.quantization.origin in LIBRARY_METHODS


def _vision(recipe: Recipe) -> bool:
    return recipe.vision is not None


def _vit_bmodel(recipe: Recipe) -> bool:
    return builds_bmodel(recipe) and recipe.vision is not None


def _bmodel_net(name: str, reads: tuple[str, ...], when: Callable[[Recipe], bool] = builds_bmodel,
                derived: tuple[Derived, ...] = (STORAGE,)) -> Step:
    return Step(name, "bmodel-net", ("llmbuild.steps.bmodel",), reads, derived, after=("prepare", "quantize"),
                priority=PRIORITY_COMPILE, when=when)


_CHIPS = ("chips/data",)
_HEAD_NETS = ("bmodel_embedding", "bmodel_embedding_cache", "bmodel_lm_head", "bmodel_vit")
STEPS: dict[str, Step] = {s.name: s for s in (
    Step("prepare", "prepare", ("llmbuild.steps.prepare",), ("source", "vision.family", "vision.config"),
         derived=(IMPORTS_PACKED,), data=("data/corpus.txt",)),
    Step("quantize", "quantize", ("llmbuild.steps.quantize", "llmbuild.quant.methods"),
         ("source", *(f for f in _QUANT_FIELDS if f != "quantization.lm_head"), *_CALIBRATION),
         data=("data/calibration",), after=("prepare",), when=_library_quantized),
    Step("reference", "reference", ("llmbuild.verify.reference",),
         ("source", "stages", "verify.prompt", "verify.prompt_ids", "verify.max_new_tokens", "verify.check_tokens"),
         derived=(ROUNDED_WEIGHTS,), after=("prepare", "quantize"), priority=PRIORITY_REFERENCE),
    Step("plan", "plan", ("llmbuild.steps.plan",), ("stages", "target"), (STORAGE,), data=_CHIPS,
         after=("prepare", "quantize"), priority=PRIORITY_COMPILE),
    Step("layer", "layer", ("llmbuild.steps.layer",), ("source", "stages", "target.chip"), (STORAGE,), data=_CHIPS,
         after=("prepare", "quantize", "plan"), priority=PRIORITY_COMPILE),
    Step("head", "head", ("llmbuild.steps.head",), ("source", "stages", "target.chip"), (STORAGE,), data=_CHIPS,
         after=("prepare", "quantize", "plan"), priority=PRIORITY_COMPILE),
    Step("vision", "vision", ("llmbuild.steps.vision",),
         ("source", "quantization.mode", "target.chip", "vision.family", "vision.exporter", "vision.image_cosine"),
         data=_CHIPS, after=("prepare",), when=_vision),
    Step("link", "link", ("llmbuild.steps.link",),
         ("source", "quantization.mode", "stages", "target", "vision.family", "vision.max_tiles"), data=_CHIPS,
         after=("layer", "head", "vision"), temp_from=("layer", "head", "vision"), priority=PRIORITY_COMPILE),
    Step("check", "check", ("llmbuild.verify.checks",), ("source", "stages", "verify.check_tokens"), (STORAGE,),
         data=_CHIPS, after=("prepare", "quantize", "plan", "reference", "layer", "head"),
         temp_from=("layer", "head"), priority=PRIORITY_CHECKS),
    Step("e2e", "e2e", ("llmbuild.verify.e2e",),
         ("source", "verify.prompt", "verify.max_new_tokens", "vision.family", "vision.max_tiles"), (STORAGE,),
         data=_CHIPS, after=("reference", "link"), priority=PRIORITY_E2E),
    Step("verify", "verify", ("llmbuild.verify.verdict",),
         ("verify", "bmodel.build", "target.chip", "vision.family", "vision.image_cosine"),
         after=("reference", "check", "e2e", "bmodel_check")),
    # The vendor's bmodel, one job per net: a net reads only what shapes it, so an edit recompiles the nets it
    # changes (stages.seq_length: the blocks; prefill_length: those and `embedding`; bmodel.history: the blocks).
    _bmodel_net("bmodel_block", ("source", "stages", "target.chip", "bmodel.history", "bmodel.cores")),
    _bmodel_net("bmodel_embedding", ("source", "stages.prefill_length", "target.chip", "bmodel.cores")),
    _bmodel_net("bmodel_embedding_cache", ("source", "target.chip", "bmodel.cores")),
    _bmodel_net("bmodel_lm_head", ("source", "target.chip", "bmodel.cores")),
    # lm_head's twin without the top-1, which a real-size bmodel's check runs instead (the same reads).
    _bmodel_net("bmodel_lm_head_logits", ("source", "target.chip", "bmodel.cores")),
    _bmodel_net("bmodel_vit", ("source", "quantization.mode", "target.chip", "vision.family", "vision.exporter",
                               "bmodel.cores"), when=_vit_bmodel, derived=()),
    # The combine in stages: a layer's nets (which they are: `bmodel.history`), the head's (with the vit net of a
    # vision-language model), then every part; each reads its parts' files, the nets' deleted once combined.
    # A compile's priority: a part's cmodel check waits on its combine, which takes a second or two.
    Step("bmodel_combine_layer", "bmodel-combine", ("llmbuild.steps.bmodel_combine",), ("bmodel.history",),
         after=("bmodel_block",), temp_from=("bmodel_block",), priority=PRIORITY_COMPILE, when=builds_bmodel),
    Step("bmodel_combine_head", "bmodel-combine", ("llmbuild.steps.bmodel_combine",), ("vision.family",),
         after=_HEAD_NETS, temp_from=_HEAD_NETS, priority=PRIORITY_COMPILE, when=builds_bmodel),
    Step("bmodel_combine", "bmodel-combine", ("llmbuild.steps.bmodel_combine",), (),
         after=("bmodel_combine_layer", "bmodel_combine_head"), priority=PRIORITY_COMPILE, when=builds_bmodel),
    Step("bmodel_check", "bmodel-check", ("llmbuild.verify.bmodel_checks",),
         ("source", "stages", "target.chip", "bmodel.history", "vision.family"), (STORAGE,),
         after=("bmodel_combine_layer", "bmodel_combine_head", "bmodel_combine", "reference",
                "bmodel_lm_head_logits"), temp_from=("bmodel_lm_head_logits",),
         priority=PRIORITY_DEVICE_CHECKS, when=builds_bmodel),
)}

_SINGLE_STEP_VERBS = {s.verb: s.name for s in STEPS.values() if s.verb not in ("bmodel-net", "bmodel-combine")}


def steps_of(recipe: Recipe) -> list[str]:
    """The steps a build of `recipe` has (the bmodel's where the recipe builds it)."""
    return [s.name for s in STEPS.values() if s.when is None or s.when(recipe)]


def step_of(verb: str, net: str | None = None, combine: str | None = None) -> str | None:
    """The step a verb runs (a bmodel net's by its name, a combine's by its stage: layer, head or model); None
    for a verb that is not a build step."""
    if verb == "bmodel-net":
        return net_step(net or "")
    if verb == "bmodel-combine":
        return {"layer": "bmodel_combine_layer", "head": "bmodel_combine_head"}.get(combine or "", "bmodel_combine")
    return _SINGLE_STEP_VERBS.get(verb)


def net_step(net: str) -> str:
    """The descriptor of a bmodel net: `block_3`, `block_cache_3`, `block_kv_3` are blocks."""
    if net == VIT_NET:
        return "bmodel_vit"
    if net == LM_HEAD_LOGITS_NET:
        return "bmodel_lm_head_logits"
    if net.startswith("block_"):
        return "bmodel_block"
    return f"bmodel_{net}"


def field_value(recipe: Recipe, path: str) -> Any:
    """What a step sees at `path`, ready for JSON: a section as a mapping of its fields (with its paths as
    written), a path field as written."""
    if path in AS_WRITTEN:
        section, key = path.split(".")
        return recipe.raw.get(section, {}).get(key)
    value: Any = recipe
    for name in path.split("."):
        value = None if value is None else getattr(value, name)
    plain = _plain(value)
    if isinstance(plain, dict) and "." not in path:
        plain.update({w.split(".")[1]: field_value(recipe, w) for w in AS_WRITTEN if w.startswith(f"{path}.")})
    return plain


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def read_values(recipe: Recipe, step: Step) -> dict[str, Any]:
    """What `step` reads of `recipe`, by declared field: the content of its rerun digest."""
    values = {path: field_value(recipe, path) for path in step.reads}
    values.update({f"={d.name}": d.of(recipe) for d in step.derived})
    return values


def canonical(values: dict[str, Any]) -> str:
    return json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

"""What the model's shape must satisfy for the recipe, checked at load: the architecture the
checkpoint names, the config's own fields, head ratios, the vocabulary, quantization groups
against every projection, and whether the model fits the chip.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NoReturn

from llmbuild import LlmbuildError
from llmbuild.recipe.checkpoints import config_json_path
from llmbuild.recipe.nodes import Loc, Node, located_error
from llmbuild.recipe.validation import Checked
from llmbuild.recipe_types import Recipe

if TYPE_CHECKING:
    from llmbuild.families.spec import ModelSpec

MAX_VOCAB = 1 << 21  # far above any released vocabulary (Gemma's 262k); beyond it a build runs out of memory


def _check_architecture(recipe: Recipe, found: str, where: str, out: Checked) -> None:
    """The model is imported as its checkpoint says; `architecture` states it, and must agree (a recipe
    that said llama over a Qwen2 checkpoint would otherwise build the Qwen2 model and claim a Llama)."""
    if recipe.architecture != found:
        raise located_error(out.given["architecture"].loc, "architecture",
                            f"expected {found} (what {where} names), got {recipe.architecture}")


def check_model(recipe: Recipe, out: Checked, check_fit: bool = True) -> None:
    """What the model's shape must satisfy for this recipe, checked at load rather than at `plan` or in a
    layer job: the config itself (a synthetic source's fields are the recipe's, so they get its lines),
    head ratios, the vocabulary, and quantization groups against every projection's input size. GGUF
    files are checked when prepare reads them."""
    from llmbuild.frontend.config_spec import architecture_without_weights, spec_without_weights
    from llmbuild.quant.scheme import recipe_scheme

    source = recipe.source
    if source.kind != "hf" or config_json_path(source.path, source.config_file) is not None:
        where = {"synthetic": "source.config's model_type", "hf": "config.json's model_type",
                 "gguf": "the GGUF file's general.architecture"}[source.kind]
        try:
            found = architecture_without_weights(source)
        except LlmbuildError:
            found = None  # an unknown model type: the model's own check below (or prepare) names it
        if found is not None:
            _check_architecture(recipe, found, where, out)
    if source.kind == "gguf" or (source.kind == "hf" and config_json_path(source.path, source.config_file) is None):
        return
    config_node = out.given.get("source.config") or out.sections["source"]
    try:
        spec = spec_without_weights(source)
    except LlmbuildError as exc:
        if "missing field" in str(exc):
            return  # an incomplete config: prepare names the field when it builds the model's shape
        if source.kind != "synthetic":
            raise  # names the checkpoint's config.json and the field
        _model_error(recipe, config_node, str(exc), getattr(exc, "field", None))
    origin = "source.config" if source.kind == "synthetic" else "config.json"
    seq = recipe.stages.seq_length
    if seq > spec.max_position_embeddings:
        raise located_error(out.given["stages.seq_length"].loc, "stages.seq_length",
                            f"expected at most {origin}.max_position_embeddings ({spec.max_position_embeddings}, the "
                            f"positions the model was made for), got {seq}")
    if spec.num_heads % spec.num_kv_heads:
        _model_error(recipe, config_node, f"{origin}: num_attention_heads {spec.num_heads} is not a multiple of "
                     f"num_key_value_heads {spec.num_kv_heads}")
    if spec.vocab_size > MAX_VOCAB:
        _model_error(recipe, config_node, f"{origin}: vocab_size {spec.vocab_size}: expected at most {MAX_VOCAB}")
    if check_fit:
        _check_fit(recipe, spec, out)
    scheme = recipe_scheme(recipe.quantization)
    if scheme is None:
        return
    inputs = {"hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
              "num_attention_heads x head_dim": spec.num_heads * spec.head_dim}
    for what, k in inputs.items():
        try:
            scheme.group_for(k)
        except LlmbuildError:
            node = out.given.get("quantization.group_size") or out.given.get("quantization.mode") \
                or out.sections["quantization"]
            raise located_error(node.loc, "quantization.group_size",
                                        f"expected a group size dividing every projection's inputs, got "
                                        f"{scheme.group_size}, which does not divide {what} {k}") from None


def _check_fit(recipe: Recipe, spec: ModelSpec, out: Checked) -> None:
    """The chip's device memory holds the weights, the KV cache and the buffers (the cost model's layout,
    milliseconds for any size): refused here, at the line to change, not at `plan` after `prepare`."""
    from llmbuild.cost.for_recipe import FIT_ADVICE, limit_source, recipe_memory

    memory = recipe_memory(recipe, spec)
    if memory.fits:
        return
    regions = memory.regions
    if "target.device_memory_bytes" in out.given:
        field = "target.device_memory_bytes"
    elif regions.get("kv", 0) + regions.get("activation", 0) > regions.get("weight", 0):
        field = "stages.seq_length"  # the cache and the activations grow with it; the weights do not
    else:
        field = "quantization.mode" if "quantization.mode" in out.given else "target.chip"
    node = out.given.get(field) or out.sections["target"]
    raise located_error(node.loc, field, f"expected room for the model in {recipe.target.chip}'s "
                        f"{memory.limit_bytes / 2**30:.2f} GiB of device memory ({limit_source(recipe)}), got a "
                        f"model that needs {memory.breakdown()}: {FIT_ADVICE}")


def _model_error(recipe: Recipe, config_node: Node, message: str, field: str | None = None) -> NoReturn:
    """A fault of the model's configuration: at the recipe's line for a synthetic source (the line of
    `field`, else of the config field the message names, the last one named when several are), else the
    checkpoint's file."""
    message = message.removeprefix("source.config: ")
    if recipe.source.kind == "synthetic":
        fields = config_node.value if isinstance(config_node.value, dict) else {}
        key = field.split("[")[0] if field else None
        if key in fields:
            message = message.removeprefix(f"{field}: ")
            raise located_error(_item_loc(fields[key], field), f"source.config.{field}", message)
        # A field the recipe does not spell out (a derived head_dim): the line of the fields it comes from.
        named = [(message.rfind(key), key) for key in fields if re.search(rf"\b{re.escape(key)}\b", message)]
        if named:
            key = max(named)[1]
            raise located_error(fields[key].loc, f"source.config.{key}", message)
        raise located_error(config_node.loc, "source.config", message)
    where = config_json_path(recipe.source.path, recipe.source.config_file) or "config.json"
    raise LlmbuildError(f"{where}: {message.removeprefix('config.json: ')}")


def _item_loc(node: Node, field: str) -> Loc:
    """The line of `layer_types[3]` inside a list node (a flow list `[a, b]` has one line for all)."""
    index = re.fullmatch(r"[^\[]+\[(\d+)\]", field)
    if index and isinstance(node.value, list) and int(index.group(1)) < len(node.value):
        return node.value[int(index.group(1))].loc
    return node.loc

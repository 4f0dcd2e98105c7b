"""Load a recipe: safe YAML -> inheritance (`base:`) -> sandboxed templates -> validation -> `Recipe`.

Every value keeps the file and line it came from, so each error is one line of the form
``<file>:<line>: <dotted.field>: expected <what>, got <what>``. Everything a build needs to know
about its inputs (types, ranges, checkpoints on disk) is checked here, before any work starts.

This module runs the steps in order and builds the typed recipe; each step is a module of its own:
finding.py (which file), yaml_reader.py and nodes.py (safe YAML into located values), inheritance.py
(`base:`), templates.py (the sandboxed Jinja), validation.py (the schema table), cross_rules.py (rules
across fields), checkpoints.py (where the weights are), quantization.py (`auto` against the checkpoint),
tolerances.py (absent tolerances) and model_checks.py (the model's shape against the recipe).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError
from llmbuild.families.registry import family_part, get_family
from llmbuild.recipe import schema_table as st
from llmbuild.recipe.checkpoints import (
    config_json_path,
    locate_checkpoint,
    resolve_path,
    shipped_config,
)
from llmbuild.recipe.cross_rules import check_rules
from llmbuild.recipe.finding import find_recipe
from llmbuild.recipe.inheritance import load_tree
from llmbuild.recipe.model_checks import check_model
from llmbuild.recipe.nodes import located_error
from llmbuild.recipe.sandbox import BoundedSandbox
from llmbuild.recipe.templates import EnvironView, NamedUndefined, render_tree
from llmbuild.recipe.tolerances import default_image_cosine, default_tolerances
from llmbuild.recipe.validation import Checked, check_section
from llmbuild.recipe_types import (
    BmodelConfig,
    QuantConfig,
    Recipe,
    SourceConfig,
    VerifyConfig,
    VisionConfig,
)


def load_recipe(name_or_path: str | Path, recipes_dir: Path | None = None, require_checkpoint: bool = True,
                check_fit: bool = True) -> Recipe:
    """Load, merge, render and fully validate a recipe; raise LlmbuildError (one line) on any fault.

    `require_checkpoint=False` is for tools that need only the model's shape (`llmbuild estimate`): an
    hf recipe with an existing `source.config_file` then loads without its checkpoint directory.
    `check_fit=False` loads a model the chip cannot hold (`llmbuild estimate` reports how far it is off);
    a build always checks.
    """
    path = find_recipe(name_or_path, recipes_dir)
    name = path.stem
    tree = load_tree(path)
    render_tree(tree, "", BoundedSandbox(undefined=NamedUndefined, keep_trailing_newline=True),
                 {"env": EnvironView(), "recipe": name})
    out = Checked(raw={}, given={}, sections={})
    out.raw = check_section("", tree, out)
    check_rules(out, path)
    checkpoint = locate_checkpoint(out, require_checkpoint)
    config_file = shipped_config(out)
    quant = _resolve_quantization(out, checkpoint, config_file)
    recipe = _build(name, path, out.raw, checkpoint, config_file, quant)
    check_model(recipe, out, check_fit)
    return recipe


def _resolve_quantization(out: Checked, checkpoint: Path | None, config_file: Path | None) -> dict[str, Any]:
    from llmbuild.recipe.quantization import resolve

    q = dict(out.raw["quantization"])
    if "quantization.calibration" in out.given:
        q["calibration"] = str(resolve_path(out.given["quantization.calibration"]))
    config_path = config_json_path(checkpoint, config_file)

    def fail(field: str, message: str) -> LlmbuildError:
        node = out.given.get(field) or out.given.get("quantization.mode") or out.sections["quantization"]
        return located_error(node.loc, field, message)

    data_dir = Path(__file__).resolve().parent.parent / "data"
    return resolve(q, set(out.given), out.raw["source"]["kind"], config_path, data_dir, fail)


def _build(name: str, path: Path, raw: dict[str, Any], checkpoint: Path | None,
           config_file: Path | None, quant: dict[str, Any]) -> Recipe:
    """The typed recipe from the validated mapping: each section as checked (schema_table.build_section),
    with what the loader computed: the located checkpoint, the resolved quantization, absent tolerances."""
    source = st.build_section(SourceConfig, raw["source"],
                              # Resolved and absolute; for a packaged GGUF, the located file.
                              path=str(checkpoint) if checkpoint is not None else None,
                              config_file=str(config_file) if config_file is not None else None)
    layers, params, per_token = _model_size(source)
    state_roundings = per_token * raw["stages"]["seq_length"]
    verify, vision = raw["verify"], raw["vision"]
    return st.build_section(
        Recipe, raw, name=name, path=path.resolve(), raw=raw, source=source,
        quantization=st.build_section(QuantConfig, quant, checkpoint=quant.get("checkpoint")),
        bmodel=st.build_section(BmodelConfig, raw["bmodel"], build=_bmodel_build(raw)),
        verify=st.build_section(VerifyConfig, verify, **_absent_tolerances(verify, quant["mode"], layers, params,
                                                                               state_roundings)),
        vision=None if vision["family"] is None else st.build_section(
            VisionConfig, vision, image_cosine=vision["image_cosine"] if vision["image_cosine"] is not None
            else default_image_cosine(quant["mode"])),
    )


def _bmodel_build(raw: dict[str, Any]) -> bool | None:
    """bmodel.build as given; absent, false for a vision-language family whose vit net has no vendor form
    (its family module's NO_VENDOR_EXPORT: a bmodel without it would not run the model the recipe
    describes), else absent (recipe_types.builds_bmodel: where the vendor supports the chip)."""
    build, family = raw["bmodel"]["build"], raw["vision"]["family"]
    if build is None and family is not None and family_part(family, "family").NO_VENDOR_EXPORT:
        return False
    return build


def _model_size(source: SourceConfig) -> tuple[int | None, float | None, int]:
    """(layers, parameters, the float32 roundings its recurrent state takes per token) of the model, which the default
    tolerances depend on (recipe/tolerances.py); None where the configuration does not say (the model's own
    check, or prepare, names what is missing)."""
    from llmbuild.frontend.config_spec import spec_without_weights

    try:
        spec = spec_without_weights(source)
    except (LlmbuildError, KeyError, TypeError, ValueError):
        return None, None, 0
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    layer = spec.hidden_size * (2 * q + 2 * kv) + 3 * spec.hidden_size * spec.intermediate_size
    per_token = get_family(spec.architecture).recurrence_roundings_per_token
    return spec.num_layers, float(spec.num_layers * layer + spec.vocab_size * spec.hidden_size), per_token


def _absent_tolerances(verify: dict[str, Any], mode: str, layers: int | None, params: float | None,
                       state_roundings: int) -> dict[str, float]:
    defaults = default_tolerances(mode, layers, params, state_roundings)
    return {kind: value for kind, value in defaults.items() if verify.get(kind) is None}

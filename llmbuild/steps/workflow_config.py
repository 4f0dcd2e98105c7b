"""The Snakefile's configuration (config/config.yaml, `--config`, `--configfile`) turned into what the
steps read. The workflow validates the file against config/schema.yaml first (Snakemake's own
`validate`); here a null key falls back to its environment variable, then to the default, and the result
is exported to the environment, where every `llmbuild <verb>` a rule runs (and the recipes' templates,
as `env.LLMBUILD_MODELS`) read it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmbuild import LlmbuildError
from llmbuild.locations import BMODEL_ENV, BUILD_DIR_ENV
from llmbuild.recipe.checkpoints import MODELS_ENV
from llmbuild.recipe.finding import RECIPES_ENV

# config key -> (environment variable, default when neither is set)
_KEYS = {"build_dir": (BUILD_DIR_ENV, "build"), "recipes_dir": (RECIPES_ENV, "recipes"),
         "models_dir": (MODELS_ENV, None)}



@dataclass(frozen=True)
class WorkflowConfig:
    build_dir: str
    recipes_dir: str
    models_dir: str | None
    recipes: tuple[str, ...] | None  # what `all` builds; None: every buildable recipe


def apply_workflow_config(config: Mapping[str, Any]) -> WorkflowConfig:
    values: dict[str, str | None] = {}
    for key, (env, default) in _KEYS.items():
        value = config.get(key) or os.environ.get(env) or default
        if value is not None:
            os.environ[env] = str(value)
        values[key] = value
    if config.get("bmodel") is not None:
        os.environ[BMODEL_ENV] = "0" if config["bmodel"] in (False, "false") else "1"
    recipes = config.get("recipes")
    return WorkflowConfig(build_dir=str(values["build_dir"]), recipes_dir=str(values["recipes_dir"]),
                          models_dir=values["models_dir"], recipes=tuple(recipes) if recipes is not None else None)


def selected(config: WorkflowConfig, buildable: list[str]) -> list[str]:
    """The recipes `all` builds: the configured list (each must be a buildable recipe), else every one."""
    if config.recipes is None:
        return buildable
    unknown = [name for name in config.recipes if name not in buildable]
    if unknown:
        raise LlmbuildError(f"config: recipes: expected recipes in {config.recipes_dir} ({', '.join(buildable)}), "
                            f"got {', '.join(unknown)}")
    return list(config.recipes)

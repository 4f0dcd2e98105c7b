# Shared helpers for every rule file: the recipe list, per-step rerun digests, layer counts.
# Logic lives in the llmbuild library; rules only wire files to `llmbuild <verb>` commands.
from llmbuild.steps import dag
from llmbuild.steps.workflow_config import apply_workflow_config, selected
from llmbuild.recipe import list_recipes

import sys
import time

# What `snakemake --report report.html` says of the workflow; the results it shows are marked report() in
# the rule files, one category per recipe.
report: "../report/workflow.rst"

# build_dir, recipes_dir, models_dir (and their environment variables) for this run and every job.
CONFIG = apply_workflow_config(config)
BUILD = CONFIG.build_dir
_STARTED = time.time()


onstart:
    # One pass of Snakemake's scheduling loop per job event, not a growing chain of timed ones
    # (llmbuild/steps/scheduling.py).
    from llmbuild.steps.scheduling import drop_default_rate_limit

    drop_default_rate_limit(workflow)


onerror:
    # Snakemake's report ends with its own summary ("WorkflowError: At least one job did not complete
    # successfully."), printed after this handler; the step's one-line reason is printed at exit, last.
    import atexit

    from llmbuild.steps.failures import summary

    if (_reasons := summary(BUILD, _STARTED)):
        atexit.register(print, _reasons, file=sys.stderr, flush=True)
# Estimate-only recipes (`build: false`, e.g. real-size models whose weights are the user's) are not built.
# Recipes whose checkpoint is not here (real-size models: the weights are the user's) keep a target that
# fails with the loader's message saying where to put them; `all` leaves them out.
# A recipe that does not load (a typo in one file) keeps a target of its own that fails with the loader's
# one-line message; every other recipe builds.
BUILDABLE = list_recipes(buildable_only=True)  # read once: every recipe file and its bases
MISSING, BROKEN = dag.recipe_problems(BUILDABLE)
RECIPES = [r for r in BUILDABLE if r not in MISSING and r not in BROKEN]
# What `all` builds: config `recipes` when given, else every recipe above.
ALL = [r for r in selected(CONFIG, BUILDABLE) if r in RECIPES]
if MISSING:
    print(f"llmbuild: not building {', '.join(MISSING)} (no checkpoint here; `snakemake NAME` says where "
          "to put it)", file=sys.stderr)
for _name, _message in BROKEN.items():
    print(f"llmbuild: not building {_name}: {_message}", file=sys.stderr)

wildcard_constraints:
    recipe="[A-Za-z0-9_-]+",
    layer="[0-9]+",


def params_for(step):
    """Rerun a step exactly when the recipe fields it reads, or the llmbuild code it runs, change."""
    return {
        "recipe_digest": lambda w: dag.digest(w.recipe, step),
        "code": lambda w: dag.code_digest(step, w.recipe),
    }


def resources_for(step):
    """mem_mb and runtime (minutes) computed from the model's shapes (llmbuild/steps/resources.py), so
    `--resources mem_mb=N` packs jobs safely on one machine and a cluster profile asks for the right node."""
    return {
        "mem_mb": lambda w: dag.resources(w.recipe, step).mem_mb,
        "runtime": lambda w: dag.resources(w.recipe, step).runtime_min,
    }


def layer_ids(w):
    return range(dag.layer_count(w.recipe))


def quantized_input(w):
    """The quantize step's checkpoint, for recipes quantized by a library in the build; else nothing.
    `w`: the job's wildcards, or a dict with the recipe for the rules defined per recipe."""
    recipe = w["recipe"] if isinstance(w, dict) else w.recipe
    return [f"{BUILD}/{recipe}/quantized"] if dag.uses_quantize_step(recipe) else []

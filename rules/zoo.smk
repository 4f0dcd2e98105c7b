# The nightly model zoo (docs/zoo.md): `snakemake --cores 2 zoo` tries every buildable recipe (config
# `recipes` when given), records each one's outcome and writes <build>/zoo/index.html, a history record
# and the regressions since the previous run.
#
# Keep-going without --keep-going: a failing job stops a Snakemake run, and the workflow profile keeps
# that for everyday builds. So each recipe is one `zoo_recipe` job that builds it with a Snakemake run of
# its own (`snakemake RECIPE`: this Snakefile, the workflow profile, the same build directory) and records
# the outcome (verified; failed with the step and its message; skipped without a checkpoint) instead of
# failing. The jobs take every core in turn, so a recipe's own layer jobs still run side by side; the page
# job runs after the last of them. The run id (a UTC timestamp) names this run's results and record.
from snakemake.exceptions import WorkflowError

from llmbuild.steps.workflow_config import selected
from llmbuild.zoo.layout import new_run_id


def _zoo_cores(wildcards):
    """Every core of this run for the recipe's own run. Asked when a zoo job is made, not when the Snakefile
    is read: a cluster run given only --jobs has no core count, and must still read the Snakefile."""
    try:
        return workflow.cores
    except WorkflowError:
        return 1


ZOO = f"{BUILD}/zoo"
ZOO_RECIPES = selected(CONFIG, BUILDABLE)  # common.smk
ZOO_RUN = new_run_id(ZOO)

# Both only start Snakemake runs or read files: on a cluster they stay on the submitting machine.
localrules:
    zoo,
    zoo_recipe,


rule zoo_recipe:
    output:
        result=f"{ZOO}/runs/{{run}}/{{recipe}}.json",
    log:
        f"{ZOO}/runs/{{run}}/{{recipe}}.log",
    wildcard_constraints:
        run="[0-9]{8}T[0-9]{6}Z(-[0-9]+)?",
    threads: _zoo_cores
    params:
        snakefile=workflow.main_snakefile,
    shell:
        "llmbuild zoo-recipe {wildcards.recipe} --snakefile {params.snakefile:q} --cores {threads} "
        "--out {output.result:q} > {log:q} 2>&1"


rule zoo:
    input:
        [f"{ZOO}/runs/{ZOO_RUN}/{r}.json" for r in ZOO_RECIPES],
    output:
        record=f"{ZOO}/history/{ZOO_RUN}.json",
        page=f"{ZOO}/index.html",
        regressions=f"{ZOO}/regressions.json",
    params:
        zoo=ZOO,
        run=ZOO_RUN,
    shell:
        "llmbuild zoo-page {params.zoo:q} --run {params.run}"

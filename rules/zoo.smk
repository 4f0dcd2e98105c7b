# The nightly model zoo (docs/zoo.md): `snakemake --cores 2 zoo` tries every buildable recipe (config
# `recipes` when given), records each one's outcome and writes <build>/zoo/index.html, a history record
# and the regressions since the previous run.
#
# One schedule for every recipe, keep-going for the zoo only: the workflow profile stops a run at the
# first failing job (what an everyday `snakemake RECIPE` wants), and Snakemake runs no job downstream of
# a failed one, so a page job depending on the recipes' results would never run after a failure. So
# `zoo_build` (a local job) starts ONE Snakemake run of this Snakefile with `--keep-going` whose targets
# are every recipe's `zoo_built` marker: all recipes' steps in one DAG, ordered by priority and resources
# (on a cluster: submitted together, up to the profile's `jobs`). A recipe whose jobs all succeeded gets
# its marker; the run then records each recipe's outcome (verified; failed with the step and its message;
# skipped without a checkpoint) in runs/<run>/<recipe>.json and never fails. The page job reads them, and
# the run's Snakemake log (runs/<run>.log) for the jobs-in-flight plot. The run id (a UTC timestamp)
# names this run's results and record.
from snakemake.exceptions import WorkflowError

from llmbuild.steps.workflow_config import selected
from llmbuild.zoo.layout import new_run_id


def _zoo_cores(wildcards):
    """Every core of this run for the zoo's own run. Asked when the job is made, not when the Snakefile
    is read: a cluster run given only --jobs has no core count, and must still read the Snakefile."""
    try:
        return workflow.cores
    except WorkflowError:
        return 1


ZOO = f"{BUILD}/zoo"
ZOO_RECIPES = selected(CONFIG, BUILDABLE)  # common.smk
ZOO_RUN = new_run_id(ZOO)

# They only start a Snakemake run, mark a file or read files: on a cluster they stay on the submitting machine.
localrules:
    zoo,
    zoo_build,
    zoo_built,


rule zoo_built:
    # Made only when every step of the recipe succeeded in this zoo run: the recipe's "built" outcome.
    input:
        f"{BUILD}/{{recipe}}/verify.json",
        f"{BUILD}/{{recipe}}/perf.json",
    output:
        touch(f"{ZOO}/runs/{{run}}/{{recipe}}.built"),
    wildcard_constraints:
        run="[0-9]{8}T[0-9]{6}Z(-[0-9]+)?",


rule zoo_build:
    output:
        [f"{ZOO}/runs/{ZOO_RUN}/{r}.json" for r in ZOO_RECIPES],
    log:
        f"{ZOO}/runs/{ZOO_RUN}.log",
    threads: _zoo_cores
    params:
        snakefile=workflow.main_snakefile,
        recipes=" ".join(ZOO_RECIPES),
        zoo=ZOO,
        run=ZOO_RUN,
    shell:
        "llmbuild zoo-build {params.recipes} --zoo {params.zoo:q} --run {params.run} "
        "--snakefile {params.snakefile:q} --cores {threads} > {log:q} 2>&1"


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

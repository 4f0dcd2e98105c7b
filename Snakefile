# llmbuild: one target per recipe (`snakemake --cores 2 qwen2_tiny_f32`), `all` builds every recipe.
# The rules live in rules/*.smk; each calls one `llmbuild <verb>` command.

import os

from snakemake.utils import validate

# config/config.yaml, overridden by --configfile and --config; checked against its schema before use.
configfile: os.path.join(workflow.basedir, "config", "config.yaml")
validate(config, os.path.join(workflow.basedir, "config", "schema.yaml"))


include: "rules/common.smk"
include: "rules/prepare.smk"
include: "rules/quantize.smk"
include: "rules/reference.smk"
include: "rules/vision.smk"
include: "rules/compile.smk"
include: "rules/bmodel.smk"
include: "rules/verify.smk"
include: "rules/zoo.smk"


rule all:
    default_target: True
    input:
        [f"{BUILD}/{r}/verify.json" for r in ALL],


for _recipe in RECIPES:

    rule:
        name:
            _recipe
        input:
            f"{BUILD}/{_recipe}/verify.json",
            f"{BUILD}/{_recipe}/perf.json",


for _recipe in [*MISSING, *BROKEN]:

    rule:
        name:
            _recipe
        params:
            recipe=_recipe,
        shell:
            # Fails with the loader's one-line message: where the checkpoint should be, or what is wrong
            # with the recipe (file, line and field).
            "llmbuild prepare {params.recipe}"

# End to end against transformers, then the recipe's tolerances applied to every recorded check.

rule e2e:
    input:
        binary=rules.link.output.binary,
        reference=rules.reference.output.reference,
    output:
        e2e=f"{BUILD}/{{recipe}}/e2e.json",
    params:
        **params_for("e2e"),
    threads: 2  # the last step but one, alone: the host path runs its tiles on both cores (same bits)
    resources:
        **resources_for("e2e"),
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/e2e.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/e2e.log",
    shell:
        "llmbuild e2e {wildcards.recipe} > {log} 2>&1"


rule verify:
    input:
        e2e=rules.e2e.output.e2e,
        head=rules.head.output.metrics,
        layers=lambda w: [f"{BUILD}/{w.recipe}/layers/{i}/metrics.json" for i in layer_ids(w)],
    output:
        report=f"{BUILD}/{{recipe}}/verify.json",
    params:
        **params_for("verify"),
    resources:
        **resources_for("verify"),
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/verify.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/verify.log",
    shell:
        "llmbuild verify {wildcards.recipe} > {log} 2>&1"

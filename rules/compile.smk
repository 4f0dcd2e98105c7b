# One job per transformer layer (its prefill, prefill_kv and decode nets), one for the head nets.
# Layers build in parallel and are cached independently.

rule layer:
    input:
        spec=rules.prepare.output.spec,
        quantized=quantized_input,
        plan=rules.plan.output.plan,
        reference=rules.reference.output.reference,
    output:
        obj=f"{BUILD}/{{recipe}}/layers/{{layer}}/layer.llmo",
        metrics=f"{BUILD}/{{recipe}}/layers/{{layer}}/metrics.json",
    params:
        **params_for("compile"),
    resources:
        mem_mb=2000,
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/layer_{{layer}}.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/layer_{{layer}}.log",
    shell:
        "llmbuild layer {wildcards.recipe} --layer {wildcards.layer} > {log} 2>&1"


rule head:
    input:
        spec=rules.prepare.output.spec,
        quantized=quantized_input,
        plan=rules.plan.output.plan,
        reference=rules.reference.output.reference,
    output:
        obj=f"{BUILD}/{{recipe}}/head/head.llmo",
        metrics=f"{BUILD}/{{recipe}}/head/metrics.json",
    params:
        **params_for("compile"),
    resources:
        mem_mb=2000,
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/head.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/head.log",
    shell:
        "llmbuild head {wildcards.recipe} > {log} 2>&1"


rule link:
    input:
        head=rules.head.output.obj,
        layers=lambda w: [f"{BUILD}/{w.recipe}/layers/{i}/layer.llmo" for i in layer_ids(w)],
    output:
        binary=f"{BUILD}/{{recipe}}/{{recipe}}.llmb",
        perf=f"{BUILD}/{{recipe}}/perf.json",
    params:
        **params_for("compile"),
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/link.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/link.log",
    shell:
        "llmbuild link {wildcards.recipe} > {log} 2>&1"

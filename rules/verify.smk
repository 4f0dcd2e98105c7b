# The checks of every compiled net against the reference (per layer shard, and the head nets), the binary
# end to end against transformers, then the recipe's tolerances applied to every recorded check.

for _recipe in RECIPES:
    for _layers in dag.layer_shards(_recipe):
        _span = f"{_layers[0]}-{_layers[-1]}"

        rule:
            name:
                f"checks_{_recipe}_{_layers[0]}_{_layers[-1]}"
            input:
                spec=f"{BUILD}/{_recipe}/spec.json",
                quantized=quantized_input({"recipe": _recipe}),
                plan=f"{BUILD}/{_recipe}/plan.json",
                reference=f"{BUILD}/{_recipe}/reference.safetensors",
                obj=_layer_files(_recipe, _layers, "layer.llmo"),
                weights=_layer_files(_recipe, _layers, "weights.safetensors"),
                scales=dag.rounded_scales(_recipe, _layer_files(_recipe, _layers, "rounded_scales.safetensors")),
            output:
                metrics=_layer_files(_recipe, _layers, "metrics.json"),
            priority: dag.check_priority(_recipe, _layers)
            params:
                recipe_digest=dag.digest(_recipe, "check"),
                code=dag.code_digest("check", _recipe),
                layers=" ".join(str(i) for i in _layers),
                recipe=_recipe,
            resources:
                mem_mb=dag.resources(_recipe, "check", tuple(_layers)).mem_mb,
                runtime=dag.resources(_recipe, "check", tuple(_layers)).runtime_min * len(_layers),
            benchmark:
                f"{BUILD}/{_recipe}/benchmarks/checks_{_span}.tsv"
            log:
                f"{BUILD}/{_recipe}/logs/checks_{_span}.log",
            shell:
                dag.command("check", "{params.recipe} --layer {params.layers}")


rule head_check:
    input:
        spec=rules.prepare.output.spec,
        quantized=quantized_input,
        plan=rules.plan.output.plan,
        reference=rules.reference.output.reference,
        obj=rules.head.output.obj,
        weights=rules.head.output.weights,
    output:
        metrics=f"{BUILD}/{{recipe}}/head/metrics.json",
    params:
        **params_for("check"),
    resources:
        **resources_for("head_check"),
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/head_check.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/head_check.log",
    shell:
        dag.command("check", "{wildcards.recipe} --head")


rule e2e:
    input:
        binary=rules.link.output.binary,
        reference=rules.reference.output.reference,
    output:
        e2e=report(f"{BUILD}/{{recipe}}/e2e.json", caption="../report/e2e.rst", category="{recipe}",
                   subcategory="verification"),
    params:
        **params_for("e2e"),
    threads: 1  # beside the checks, which need the same cores; its tiles give the same bits on any count
    priority: dag.priority("e2e")  # the longest job after the reference (steps/descriptors.py)
    resources:
        **resources_for("e2e"),
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/e2e.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/e2e.log",
    shell:
        dag.command("e2e", "{wildcards.recipe}")


rule verify:
    input:
        e2e=rules.e2e.output.e2e,
        dequant=rules.reference.output.dequant,
        head=rules.head_check.output.metrics,
        layers=lambda w: [f"{BUILD}/{w.recipe}/layers/{i}/metrics.json" for i in layer_ids(w)],
        # The vendor's bmodel run on its simulator (rules/bmodel.smk), where the recipe builds one.
        bmodel=lambda w: dag.when_bmodel(w.recipe, f"{BUILD}/{w.recipe}/bmodel.json"),
    output:
        report=report(f"{BUILD}/{{recipe}}/verify.json", caption="../report/verify.rst", category="{recipe}",
                      subcategory="verification"),
    params:
        **params_for("verify"),
    resources:
        **resources_for("verify"),
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/verify.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/verify.log",
    shell:
        dag.command("verify", "{wildcards.recipe}")

# The layers in shards (a few consecutive layers per job: a job's start-up would outweigh a small model's
# layer), one job for the head nets, then link. Shards are sized by the layer's weights
# (llmbuild/steps/shards.py): a 7B layer is a job of its own, so big models build in parallel and resume
# layer by layer; a job holds one layer at a time. Each shard is its own rule (a job's outputs must be
# known before it runs; a shard's are its layers'). Compiling does not wait for the reference: the checks
# are rules of their own (verify.smk), and link can run while the reference does.


def _layer_files(recipe, layers, name):
    return [f"{BUILD}/{recipe}/layers/{i}/{name}" for i in layers]


for _recipe in RECIPES:
    for _layers in dag.layer_shards(_recipe):
        _span = f"{_layers[0]}-{_layers[-1]}"

        rule:
            name:
                f"layers_{_recipe}_{_layers[0]}_{_layers[-1]}"
            input:
                spec=f"{BUILD}/{_recipe}/spec.json",
                quantized=quantized_input({"recipe": _recipe}),
                plan=f"{BUILD}/{_recipe}/plan.json",
            output:
                obj=_layer_files(_recipe, _layers, "layer.llmo"),
                # Each layer's weights until link and the checks have read them: then deleted (bounded disk).
                weights=[temp(f) for f in _layer_files(_recipe, _layers, "weights.safetensors")],
                # Rounded in the build: each layer's float32 scales, for its checks (then deleted).
                scales=[temp(f) for f in dag.rounded_scales(_recipe, _layer_files(_recipe, _layers,
                                                                                  "rounded_scales.safetensors"))],
            params:
                recipe_digest=dag.digest(_recipe, "layer"),
                code=dag.code_digest("layer", _recipe),
                layers=" ".join(str(i) for i in _layers),
                recipe=_recipe,
            priority: dag.priority("layer")
            resources:
                mem_mb=dag.resources(_recipe, "layer").mem_mb,
                runtime=dag.resources(_recipe, "layer").runtime_min * len(_layers),
            benchmark:
                f"{BUILD}/{_recipe}/benchmarks/layers_{_span}.tsv"
            log:
                f"{BUILD}/{_recipe}/logs/layers_{_span}.log",
            shell:
                dag.command("layer", "{params.recipe} --layer {params.layers}")


rule head:
    input:
        spec=rules.prepare.output.spec,
        quantized=quantized_input,
        plan=rules.plan.output.plan,
    output:
        obj=f"{BUILD}/{{recipe}}/head/head.llmo",
        weights=temp(f"{BUILD}/{{recipe}}/head/weights.safetensors"),
    params:
        **params_for("head"),
    priority: dag.priority("head")
    resources:
        **resources_for("head"),
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/head.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/head.log",
    shell:
        dag.command("head", "{wildcards.recipe}")


rule link:
    input:
        head=rules.head.output.obj,
        head_weights=rules.head.output.weights,
        layers=lambda w: _layer_files(w.recipe, layer_ids(w), "layer.llmo"),
        weights=lambda w: _layer_files(w.recipe, layer_ids(w), "weights.safetensors"),
        # The vit net's files for a vision-language recipe, none for a text one.
        vision=lambda w: dag.when_vision(w.recipe, rules.vision.output.obj, rules.vision.output.weights,
                                         rules.vision.output.plan),
    output:
        binary=f"{BUILD}/{{recipe}}/{{recipe}}.llmb",
        # The binary's summaries in `snakemake --report` (the binary itself is too big to embed in a page).
        memory=report(f"{BUILD}/{{recipe}}/memory.json", caption="../report/memory.rst", category="{recipe}",
                      subcategory="binary"),
        perf=report(f"{BUILD}/{{recipe}}/perf.json", caption="../report/perf.rst", category="{recipe}",
                    subcategory="binary"),
    params:
        **params_for("link"),
    priority: dag.priority("link")
    resources:
        **resources_for("link"),
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/link.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/link.log",
    shell:
        dag.command("link", "{wildcards.recipe}")

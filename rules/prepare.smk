# The checkpoint the build reads (synthetic, GGUF tokenizer files, or a pointer to an HF directory),
# the model spec, and the global device-memory plan.

rule prepare:
    output:
        spec=f"{BUILD}/{{recipe}}/spec.json",
    params:
        **params_for("prepare"),
    resources:
        **resources_for("prepare"),
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/prepare.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/prepare.log",
    shell:
        dag.command("prepare", "{wildcards.recipe}")


rule plan:
    input:
        spec=rules.prepare.output.spec,
        quantized=quantized_input,
    output:
        plan=f"{BUILD}/{{recipe}}/plan.json",
    params:
        **params_for("plan"),
    priority: dag.priority("plan")
    resources:
        **resources_for("plan"),
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/plan.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/plan.log",
    shell:
        dag.command("plan", "{wildcards.recipe}")

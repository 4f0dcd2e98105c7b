# The independent reference: transformers runs the source checkpoint once per recipe.

rule reference:
    input:
        spec=rules.prepare.output.spec,
        quantized=quantized_input,
    output:
        reference=f"{BUILD}/{{recipe}}/reference.safetensors",
        # The first and last layers' quantized tensors as an implementation llmbuild did not write reads them.
        dequant=f"{BUILD}/{{recipe}}/dequant_check.json",
    params:
        **params_for("reference"),
    # One thread while the compile jobs, which do not need it, run beside it; two for a model whose
    # reference takes far longer than its compilation (from a few billion parameters up).
    priority: dag.priority("reference")
    threads: lambda w: dag.reference_threads(w.recipe)
    resources:
        **resources_for("reference"),
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/reference.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/reference.log",
    shell:
        "HF_HUB_OFFLINE=1 " + dag.command("reference", "{wildcards.recipe}")

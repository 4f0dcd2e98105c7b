# The independent reference: transformers runs the source checkpoint once per recipe.

rule reference:
    input:
        spec=rules.prepare.output.spec,
        quantized=quantized_input,
    output:
        reference=f"{BUILD}/{{recipe}}/reference.safetensors",
    params:
        **params_for("reference"),
    threads: 2  # it runs alone (everything after it waits for it): torch may use both cores
    resources:
        **resources_for("reference"),
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/reference.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/reference.log",
    shell:
        "HF_HUB_OFFLINE=1 llmbuild reference {wildcards.recipe} > {log} 2>&1"

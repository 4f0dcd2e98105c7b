# The vit net of a vision-language model: the tower exported by torch.onnx, imported as TopOp, compiled
# with its own memory plan and checked against transformers (llmbuild/steps/vision.py). Recipes without
# `vision.family` never ask for it (link's input is empty for them).

rule vision:
    input:
        spec=rules.prepare.output.spec,
    output:
        obj=f"{BUILD}/{{recipe}}/vision/vision.llmo",
        # the vit net's device-format weights until link copies them into the binary, like a layer's
        weights=temp(f"{BUILD}/{{recipe}}/vision/weights.safetensors"),
        plan=f"{BUILD}/{{recipe}}/vision/plan.json",
        metrics=f"{BUILD}/{{recipe}}/vision/metrics.json",
    params:
        **params_for("vision"),
    # Both cores: at real size its checks (the static net on the device and on the host, a few pieces each)
    # outlast every other job, which has finished by then; the results are the same bits on any count.
    threads: 2
    resources:
        **resources_for("vision"),
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/vision.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/vision.log",
    shell:
        dag.command("vision", "{wildcards.recipe}")

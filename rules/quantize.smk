# Quantization in the build through a library (quantization.method gptq, awq or autoround): the float
# checkpoint becomes the library's own quantized checkpoint, which every later step imports. Cached on
# the source, the quantization section, the calibration text and the quantization code only, so a
# compiler change does not redo minutes of calibration.

rule quantize:
    input:
        spec=rules.prepare.output.spec,
        calibration=lambda w: dag.calibration_file(w.recipe),
    output:
        quantized=directory(f"{BUILD}/{{recipe}}/quantized"),
        report=report(f"{BUILD}/{{recipe}}/quantize.json", caption="../report/quantize.rst", category="{recipe}",
                      subcategory="quantization"),
    params:
        recipe_digest=lambda w: dag.digest(w.recipe, "quantize"),
        code=lambda w: dag.code_digest("quantize", w.recipe),
    threads: 2
    resources:
        # A cluster profile sends it to a larger node: calibration holds the float model and activations.
        **resources_for("quantize"),
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/quantize.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/quantize.log",
    shell:
        "HF_HUB_OFFLINE=1 " + dag.command("quantize", "{wildcards.recipe}")

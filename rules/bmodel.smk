# The vendor's deployable .bmodel (docs/bmodel.md): each net exported from TopOp and compiled by TPU-MLIR's
# own tools in a job of its own, then combined in stages (a layer's three nets, the head's, the model), then
# run on the vendor's simulator against the reference. Built for recipes whose `target.bmodel` holds (by
# default, the chips TPU-MLIR supports); the .llmb steps do not depend on any of it.

wildcard_constraints:
    net="(block|block_kv|block_cache)_[0-9]+|embedding|embedding_cache|lm_head|lm_head_logits|vit",


def _bmodel_params(step):
    return {
        "recipe_digest": lambda w: dag.digest(w.recipe, step),
        "code": lambda w: dag.code_digest(step, w.recipe),
        "toolchain": dag.TOOLCHAIN_VERSION,  # a new TPU-MLIR recompiles every net
    }


rule bmodel_net:
    input:
        spec=rules.prepare.output.spec,
        quantized=quantized_input,
        # A block net of a recipe rounded in the build reads the levels its layer's job rounded.
        layer=lambda w: dag.bmodel_layer_files(w.recipe, w.net, BUILD),
    output:
        # Read once by its layer's (or the head's) combine, then deleted: a net's bmodel carries its layer's
        # weights whole, so keeping them would hold each layer twice more. The build directory keeps the
        # layers' and the head's combined files and the binary: twice the binary.
        bmodel=temp(f"{BUILD}/{{recipe}}/bmodel/nets/{{net}}/{{net}}.bmodel"),
    params:
        # Per net: an edit recompiles the nets that read the field it changes (steps/descriptors.py).
        recipe_digest=lambda w: dag.bmodel_net_digest(w.recipe, w.net),
        code=lambda w: dag.code_digest(dag.net_step(w.net), w.recipe),
        toolchain=dag.TOOLCHAIN_VERSION,
    priority: dag.priority("bmodel_block")
    resources:
        mem_mb=lambda w: dag.bmodel_resources(w.recipe, "net", w.net).mem_mb,
        runtime=lambda w: dag.bmodel_resources(w.recipe, "net", w.net).runtime_min,
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/bmodel_{{net}}.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/bmodel_{{net}}.log",
    shell:
        dag.command("bmodel_block", "{wildcards.recipe} --net {wildcards.net}")


rule bmodel_layer:
    input:
        nets=lambda w: [f"{BUILD}/{w.recipe}/bmodel/nets/{n}/{n}.bmodel" for n in dag.bmodel_layer_nets(w.recipe, w.layer)],
    output:
        # Kept (one copy of the layer's weights): an edit that leaves a layer alone does not recompile it.
        bmodel=f"{BUILD}/{{recipe}}/bmodel/layers/{{layer}}.bmodel",
    params:
        **_bmodel_params("bmodel_combine_layer"),
    priority: dag.priority("bmodel_combine_layer")
    resources:
        mem_mb=lambda w: dag.bmodel_resources(w.recipe, "combine", "layer").mem_mb,
        runtime=lambda w: dag.bmodel_resources(w.recipe, "combine", "layer").runtime_min,
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/combine_layer_{{layer}}.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/bmodel_layer_{{layer}}.log",
    shell:
        dag.command("bmodel_combine_layer", "{wildcards.recipe} --layer {wildcards.layer}")


rule bmodel_head:
    input:
        nets=lambda w: [f"{BUILD}/{w.recipe}/bmodel/nets/{n}/{n}.bmodel" for n in dag.bmodel_head_nets(w.recipe)],
    output:
        bmodel=f"{BUILD}/{{recipe}}/bmodel/head.bmodel",
    params:
        **_bmodel_params("bmodel_combine_head"),
    priority: dag.priority("bmodel_combine_head")
    resources:
        mem_mb=lambda w: dag.bmodel_resources(w.recipe, "combine", "head").mem_mb,
        runtime=lambda w: dag.bmodel_resources(w.recipe, "combine", "head").runtime_min,
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/combine_head.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/bmodel_head.log",
    shell:
        dag.command("bmodel_combine_head", "{wildcards.recipe} --head")


rule bmodel:
    input:
        head=rules.bmodel_head.output.bmodel,
        layers=lambda w: [f"{BUILD}/{w.recipe}/bmodel/layers/{i}.bmodel" for i in layer_ids(w)],
    output:
        bmodel=f"{BUILD}/{{recipe}}/{{recipe}}.bmodel",
    params:
        **_bmodel_params("bmodel_combine"),
    priority: dag.priority("bmodel_combine")
    resources:
        mem_mb=lambda w: dag.bmodel_resources(w.recipe, "combine").mem_mb,
        runtime=lambda w: dag.bmodel_resources(w.recipe, "combine").runtime_min,
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/bmodel.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/bmodel.log",
    shell:
        dag.command("bmodel_combine", "{wildcards.recipe} --model")


def _part_files(w):
    """The bmodel a part check loads, and for `lm_head` the head's file its weights are compared with."""
    head = f"{BUILD}/{w.recipe}/bmodel/head.bmodel"
    if w.part == "head":
        return [head]
    if w.part == "lm_head":
        return [f"{BUILD}/{w.recipe}/bmodel/nets/lm_head_logits/lm_head_logits.bmodel", head]
    return [f"{BUILD}/{w.recipe}/bmodel/layers/{w.part.removeprefix('layer_')}.bmodel"]


# A real-size model's checks run on its parts as soon as each is combined (the head's, lm_head's twin, each
# sampled layer's), each part alone in its runtime, so the cmodel's minutes overlap the compile jobs.
rule bmodel_check_part:
    input:
        part=_part_files,
        reference=rules.reference.output.reference,
    output:
        checks=f"{BUILD}/{{recipe}}/bmodel/checks/{{part}}.json",
    wildcard_constraints:
        part="head|lm_head|layer_[0-9]+",
    params:
        **_bmodel_params("bmodel_check"),
    priority: dag.priority("bmodel_check")
    resources:
        mem_mb=lambda w: dag.bmodel_resources(w.recipe, "check", w.part).mem_mb,
        runtime=lambda w: dag.bmodel_resources(w.recipe, "check", w.part).runtime_min,
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/bmodel_check_{{part}}.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/bmodel_check_{{part}}.log",
    shell:
        dag.command("bmodel_check", "{wildcards.recipe} --part {wildcards.part}")


rule bmodel_check:
    input:
        # The binary itself (its parts loaded one by one into one runtime make the BM1684X cmodel assert on an
        # f32 net's alignment: not what a board loads); a real-size model's parts were checked on their own,
        # and its binary is loaded where it fits a job (steps/resources.py's final_check_loads_binary).
        bmodel=rules.bmodel.output.bmodel,
        reference=rules.reference.output.reference,
        parts=lambda w: [f"{BUILD}/{w.recipe}/bmodel/checks/{p}.json" for p in dag.bmodel_check_parts(w.recipe)],
    output:
        checks=report(f"{BUILD}/{{recipe}}/bmodel.json", caption="../report/bmodel.rst", category="{recipe}",
                      subcategory="verification"),
    params:
        **_bmodel_params("bmodel_check"),
    resources:
        mem_mb=lambda w: dag.bmodel_resources(w.recipe, "check").mem_mb,
        runtime=lambda w: dag.bmodel_resources(w.recipe, "check").runtime_min,
    benchmark:
        f"{BUILD}/{{recipe}}/benchmarks/bmodel_check.tsv"
    log:
        f"{BUILD}/{{recipe}}/logs/bmodel_check.log",
    shell:
        dag.command("bmodel_check", "{wildcards.recipe}")

"""The compile step runs a parsed pass pipeline and writes it as the first line of tpu_*.mlir: rerun on
the top_*.mlir beside it (in this process or with `llmbuild opt`), it gives the written grouped module
byte for byte. `layer-group` builds the groups from the plans `plan-layer-groups` wrote into the module,
also after the module was printed and parsed again."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import plan_file

from llmbuild import LlmbuildError
from llmbuild.cli import main
from llmbuild.codegen.memory_plan import make_plan
from llmbuild.dialects import module_text, parse_module_text, read_module
from llmbuild.dialects.plain import main_func
from llmbuild.families.spec import ModelSpec
from llmbuild.importer.nets import Shapes, build_block, head_nets
from llmbuild.passes import pipeline_string, run_passes
from llmbuild.passes.layer_group import LayerGroup, PlanLayerGroups
from llmbuild.passes.layer_group_attr import PLANS_ATTR
from llmbuild.passes.pipeline import HEADER, PASSES, header_pipeline, parse_pipeline
from llmbuild.steps.compile_net import compile_net

TINY = ModelSpec("qwen2", 64, 2, 4, 2, 16, 128, 512, 1e-6, 10000.0, True, True, False, 256)
# (chip, local memory override, shapes): the chip's own memory, and one small enough that prefill is cut
# into row tiles and attention into key blocks (flash attention), so every field of a plan travels.
SETTINGS = {
    "bm1684x": ("bm1684x", None, Shapes(seq_length=16, prefill_length=4)),
    "bm1688-flash": ("bm1688", 16384, Shapes(seq_length=128, prefill_length=32)),
}


@pytest.fixture(scope="module", params=list(SETTINGS))
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A directory with a compiled net's top_*.mlir and tpu_*.mlir per net, and the nets' names."""
    chip, lmem, shapes = SETTINGS[request.param]
    out = tmp_path_factory.mktemp(request.param)
    plan = plan_file(make_plan(TINY, shapes, "bf16", 4096), out)
    nets = {"block_1": build_block(TINY, 1, "prefill", shapes),
            "block_kv_0": build_block(TINY, 0, "prefill_kv", shapes),
            "block_cache_1": build_block(TINY, 1, "decode", shapes), **head_nets(TINY, shapes)}
    for module in nets.values():
        compile_net(module, plan, "bf16", chip, out, lmem_bytes=lmem)
    return out, list(nets)


def test_rerunning_the_written_pipeline_gives_the_written_module(written: tuple[Path, list[str]]) -> None:
    out, nets = written
    for net in nets:
        text = (out / f"tpu_{net}.mlir").read_text()
        spec = header_pipeline(text)
        module = run_passes(read_module(out / f"top_{net}.mlir"), parse_pipeline(spec, relative_to=out))
        assert f"{HEADER}{spec}\n{module_text(module)}" == text, net
    # the small local memory really cuts: row tiles, and attention into key blocks
    if out.name.startswith("bm1688-flash"):
        grouped = (out / "tpu_block_1.mlir").read_text()
        assert "key_block" in grouped and "mode = \"tile\"" in grouped


def test_the_written_pipeline_names_every_pass_and_option(written: tuple[Path, list[str]]) -> None:
    out, nets = written
    for net in nets:
        spec = header_pipeline((out / f"tpu_{net}.mlir").read_text())
        passes = parse_pipeline(spec)
        assert [p.name for p in passes] == list(PASSES), spec
        assert pipeline_string(passes) == spec  # nothing dropped or added in the round trip
        # the plan relative to the module files: the line names no machine path
        assert passes[2].plan == "plan.json"  # type: ignore[attr-defined]
        resolved = parse_pipeline(spec, relative_to=out)
        assert Path(resolved[2].plan) == out / "plan.json"  # type: ignore[attr-defined]


def test_llmbuild_opt_reruns_the_pipeline(written: tuple[Path, list[str]], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    out, _ = written
    tpu = out / "tpu_block_1.mlir"
    assert main(["opt", str(out / "top_block_1.mlir"), "--pipeline-of", str(tpu), "-o", str(tmp_path / "a.mlir")]) == 0
    assert tpu.read_text().split("\n", 1)[1] == (tmp_path / "a.mlir").read_text()
    # and in two runs, through the printed plans: plan-layer-groups' output file, then layer-group on it
    first, last = header_pipeline(tpu.read_text()).rsplit(",", 1)
    monkeypatch.chdir(out)  # --pipeline reads a relative plan from the working directory, as mlir-opt would
    assert main(["opt", str(out / "top_block_1.mlir"), "--pipeline", first, "-o", str(tmp_path / "planned.mlir")]) == 0
    assert PLANS_ATTR in (tmp_path / "planned.mlir").read_text()
    capsys.readouterr()
    assert main(["opt", str(tmp_path / "planned.mlir"), "--pipeline", last]) == 0
    assert capsys.readouterr().out == (tmp_path / "a.mlir").read_text()


def test_layer_group_reads_the_plans_after_print_and_parse(written: tuple[Path, list[str]]) -> None:
    out, nets = written
    for net in nets:
        text = (out / f"tpu_{net}.mlir").read_text()
        *to_plans, last = parse_pipeline(header_pipeline(text), relative_to=out)
        planned = run_passes(read_module(out / f"top_{net}.mlir"), to_plans)
        reparsed = parse_module_text(module_text(planned), "planned.mlir")
        grouped = run_passes(reparsed, [last])
        assert PLANS_ATTR not in grouped.attributes
        assert module_text(grouped) == text.split("\n", 1)[1], net


def test_layer_group_without_plans_is_refused(written: tuple[Path, list[str]]) -> None:
    out, _ = written
    module = read_module(out / "top_block_1.mlir")
    *to_address, _, _ = parse_pipeline(header_pipeline((out / "tpu_block_1.mlir").read_text()), relative_to=out)
    run_passes(module, to_address)
    with pytest.raises(LlmbuildError, match="run plan-layer-groups first"):
        run_passes(module.clone(), [LayerGroup()])
    # plans made for another op list are refused, not applied to the wrong ops
    run_passes(module, [PlanLayerGroups()])
    block = main_func(module).body.block
    block.last_op.prev_op.detach()  # type: ignore[union-attr]  # an op the plans count, gone
    with pytest.raises(LlmbuildError, match="a pass between plan-layer-groups and layer-group changed"):
        LayerGroup().apply(None, module)  # type: ignore[arg-type]


def test_unknown_passes_and_options_name_the_known_ones() -> None:
    with pytest.raises(LlmbuildError, match="Unrecognized passes.*plan-layer-groups"):
        parse_pipeline("canonicalize,fuse-everything")
    with pytest.raises(LlmbuildError, match="layer-group"):
        parse_pipeline("layer-group{chip=\"bm1688\"}")
    assert parse_pipeline('plan-layer-groups{chip="bm1688" lmem_bytes=16384}') == [
        PlanLayerGroups(chip="bm1688", lmem_bytes=16384)]

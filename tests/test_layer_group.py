"""Layer groups: every group fits the chip's local memory, the grouped program computes exactly what the op
list computes, and the local-memory simulator catches wrong addresses, overlaps and oversized groups."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from helpers import plan_file, random_net_inputs
from net_cases import Case, assert_grouped_run_is_exact, assert_round_trips_and_mlir_opt_parses, run

from llmbuild.binary.memory_map import MemoryPlan
from llmbuild.binary.program import Program, TensorDesc
from llmbuild.chips import load_chip
from llmbuild.codegen.memory_plan import make_plan
from llmbuild.dialects import module_text
from llmbuild.dialects.plain import tensor_info
from llmbuild.families.spec import ModelSpec
from llmbuild.importer.nets import ROPE_COS, ROPE_SIN, Shapes, build_block, head_nets
from llmbuild.importer.rope import rope_tables
from llmbuild.numerics import masks
from llmbuild.quant.scheme import scheme_for
from llmbuild.runtime.device import Device
from llmbuild.runtime.faults import DeviceFault
from llmbuild.steps.compile_net import CompiledNet, compile_net

TINY = ModelSpec("qwen2", 64, 2, 4, 2, 16, 128, 512, 1e-6, 10000.0, True, True, False, 256)
SMOLLM2 = ModelSpec("llama", 576, 30, 9, 3, 64, 1536, 49152, 1e-5, 100000.0, True, False, False, 8192)
SHAPES = Shapes(seq_length=64, prefill_length=16)
HISTORY = 6
SMALL_LMEM = 65536  # forces row tiles, weight slices and blocks of attention heads on the tiny model


def _nets(spec: ModelSpec, shapes: Shapes, mode: str = "bf16") -> dict:
    scheme = scheme_for(mode, 32)
    return {
        "block_1": build_block(spec, 1, "prefill", shapes, scheme),
        "block_kv_0": build_block(spec, 0, "prefill_kv", shapes, scheme),
        "block_cache_1": build_block(spec, 1, "decode", shapes, scheme),
        **head_nets(spec, shapes),
    }


def _case(c: CompiledNet, plan: MemoryPlan, rng: np.random.Generator) -> Case:
    cos, sin = rope_tables(TINY, SHAPES.seq_length)
    weights = {ROPE_COS: cos, ROPE_SIN: sin}
    for op in c.top.walk():
        if op.name == "top.Weight" and op.attributes["name"].data not in weights:
            name = op.attributes["name"].data
            shape = tensor_info(op.results[0].type).shape
            w = rng.standard_normal(shape) / np.sqrt(shape[-1])
            weights[name] = (1 + 0.1 * w if "norm" in name else w).astype(np.float32)
    inputs = random_net_inputs(c.top, TINY.vocab_size, SHAPES.prefill_length, SHAPES.seq_length, HISTORY, rng)
    return Case(c, plan, weights, inputs)


@pytest.fixture(scope="module", params=[None, SMALL_LMEM], ids=["bm1684x", "small-lmem"])
def cases(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    plan = make_plan(TINY, SHAPES, "bf16", 4096)
    out = tmp_path_factory.mktemp("nets")
    rng = np.random.default_rng(11)
    return {
        name: _case(compile_net(m, plan_file(plan, out), "bf16", "bm1684x", out, lmem_bytes=request.param), plan, rng)
        for name, m in _nets(TINY, SHAPES).items()
    }


# ---- the groups and their numbers ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["block_1", "block_kv_0", "block_cache_1", "embedding", "embedding_cache",
                                  "lm_head"])
def test_grouped_run_equals_op_list_and_interpretation_bit_for_bit(cases: dict[str, Case], name: str) -> None:
    case = cases[name]
    assert case.net.program.groups
    assert_grouped_run_is_exact(case, name)  # every op, reassembled from its tiles and slices


def test_small_local_memory_forces_every_kind_of_tiling(cases: dict[str, Case]) -> None:
    progs = [c.net.program for c in cases.values()]
    cmds = [cmd for p in progs for g in p.groups for cmd in g.cmds]
    if progs[0].lmem_bytes != SMALL_LMEM:
        pytest.skip("the chip's own local memory holds the tiny model whole")
    assert any(g.tile_rows for p in progs for g in p.groups)  # row tiles
    assert any("g_out" in c.attrs and c.op == "MatMul" for c in cmds)  # weight slices
    assert any(c.op == "FAttention" and "g_in" in c.attrs for c in cmds)  # blocks of heads


def test_decode_streams_weights_and_prefill_tiles_rows(cases: dict[str, Case]) -> None:
    grouped = {name: module_text(c.net.grouped) for name, c in cases.items()}
    assert 'mode = "stream"' in grouped["block_cache_1"] and 'mode = "tile"' not in grouped["block_cache_1"]
    assert 'mode = "held"' in grouped["block_1"] and 'mode = "tile"' in grouped["block_1"]
    if cases["block_1"].net.program.lmem_bytes == SMALL_LMEM:
        return
    assert 'mode = "stream"' not in grouped["block_1"]  # prefill holds its weights for every row tile
    # decode fuses the whole layer into one group; prefill cuts at attention (keys need every row)
    assert len(cases["block_cache_1"].net.program.groups) == 1
    assert [g.tile_rows for g in cases["block_1"].net.program.groups] == [8, 0, 8]


def test_grouped_ir_parses_back_and_with_upstream_mlir_opt(cases: dict[str, Case]) -> None:
    text = module_text(cases["block_kv_0"].net.grouped)
    assert text.count('"tpu.Group"') == len(cases["block_kv_0"].net.program.groups)
    assert_round_trips_and_mlir_opt_parses(text)


@pytest.mark.parametrize("chip", ["bm1684x", "bm1688"])
@pytest.mark.parametrize("spec", [TINY, SMOLLM2], ids=["tiny", "smollm2"])
def test_every_group_fits_the_chips_local_memory(spec: ModelSpec, chip: str, tmp_path: Path) -> None:
    shapes = SHAPES if spec is TINY else Shapes(seq_length=512, prefill_length=128)
    plan = make_plan(spec, shapes, "bf16", 4096)
    lmem = load_chip(chip).lmem_bytes
    for name, module in _nets(spec, shapes).items():
        prog = compile_net(module, plan_file(plan, tmp_path), "bf16", chip, tmp_path).program
        assert prog.lmem_bytes == lmem
        assert prog.groups, name
        for g in prog.groups:
            assert 0 < g.lmem_peak_bytes <= lmem, (name, g.index, g.lmem_peak_bytes)
            # and the addresses the commands use stay inside the group's peak
            ends = [t.address + t.shape_bytes for t in _locals(prog, g)]
            assert max(ends) <= g.lmem_peak_bytes, (name, g.index)


def _locals(prog: Program, group) -> list:
    @dataclasses.dataclass
    class Placed:
        address: int
        shape_bytes: int

    out = []
    for cmd in group.cmds:
        for t in (*cmd.operands, cmd.result):
            d = prog.tensors[t]
            if d.local:
                n = {"f32": 4, "i32": 4, "bf16": 2, "f16": 2, "u8": 1}[d.dtype] * int(np.prod(d.shape))
                out.append(Placed(d.address, n))
        if "scratch" in cmd.attrs:
            out.append(Placed(*cmd.attrs["scratch"]))
    return out


def test_local_data_does_not_survive_a_group(cases: dict[str, Case]) -> None:
    # A group that reads local bytes an earlier group left behind is refused: data survives no group.
    prog = cases["block_1"].net.program
    g0, g1 = prog.groups[0], prog.groups[1]
    local_from_g0 = next(cmd.result for cmd in g0.cmds if cmd.op == "Load")
    cmd = next(c for c in g1.cmds if c.op not in ("Load", "Store"))
    broken = _replace_cmd(prog, 1, g1.cmds.index(cmd), dataclasses.replace(cmd, operands=(local_from_g0,)
                                                                            + cmd.operands[1:]))
    with pytest.raises(DeviceFault, match="before anything in this group wrote it"):
        run(cases["block_1"], broken)


# ---- fault injection --------------------------------------------------------------------------------


def _replace_cmd(prog: Program, group: int, index: int, cmd) -> Program:
    groups = list(prog.groups)
    cmds = list(groups[group].cmds)
    cmds[index] = cmd
    groups[group] = dataclasses.replace(groups[group], cmds=cmds)
    return dataclasses.replace(prog, groups=groups)


def _move_local(prog: Program, tensor: int, address: int) -> Program:
    """Move one local allocation (every view of it) to `address`."""
    buffer = prog.tensors[tensor].buffer
    delta = address - prog.tensors[tensor].address
    tensors = [dataclasses.replace(t, address=t.address + delta) if t.local and t.buffer == buffer else t
               for t in prog.tensors]
    return dataclasses.replace(prog, tensors=tensors)


def test_a_group_larger_than_local_memory_faults(cases: dict[str, Case]) -> None:
    case = cases["block_cache_1"]
    prog = case.net.program
    peak = max(g.lmem_peak_bytes for g in prog.groups)
    run(case, lmem_bytes=peak)  # exactly enough
    with pytest.raises(DeviceFault, match=r"block_cache_1: group \d+: command \d+ .*beyond local memory"):
        run(case, lmem_bytes=peak - 4096)


def test_an_oversized_plan_for_a_chip_faults_on_that_chip(tmp_path: Path) -> None:
    # Planned for 4x the BM1688's local memory, run on a BM1688: the group overflows and the device says so.
    bm1688 = load_chip("bm1688").lmem_bytes
    shapes = Shapes(seq_length=512, prefill_length=128)
    plan = make_plan(SMOLLM2, shapes, "bf16", 4096)
    module = build_block(SMOLLM2, 0, "prefill_kv", shapes)
    prog = compile_net(module, plan_file(plan, tmp_path), "bf16", "bm1688", tmp_path, lmem_bytes=4 * bm1688).program
    assert max(g.lmem_peak_bytes for g in prog.groups) > bm1688
    dev = Device(plan.activation_base + prog.activation_bytes, tuple(plan.regions["weight"]), bm1688)
    pos, mask = masks.prefill_kv(128, 16, 128, 512)
    rng = np.random.default_rng(0)
    for name, t in prog.inputs:
        value = {"position_ids": pos, "attention_mask": mask}.get(name)
        dev.set_input(prog, name, rng.standard_normal(prog.tensors[t].shape) if value is None else value)
    with pytest.raises(DeviceFault, match="beyond local memory"):
        dev.run(prog)


def test_two_live_local_buffers_at_one_address_fault(cases: dict[str, Case]) -> None:
    # The second copy of a double buffer moved onto the first: the next tile's (or slice's) load lands
    # on data still to be read.
    for name in ("block_1", "block_cache_1", "lm_head"):
        case = cases[name]
        prog = case.net.program
        loads = [(g, c) for g in prog.groups for c in g.cmds if c.op == "Load"]
        by_cmd = {}
        for g, c in loads:
            by_cmd.setdefault((g.index, c.operands[0]), []).append(c.result)
        pairs = [ts for ts in by_cmd.values() if len(ts) > 1
                 and prog.tensors[ts[0]].address != prog.tensors[ts[1]].address]
        if not pairs:
            continue  # nothing double-buffered in this net at this size
        first, second = pairs[0][0], pairs[0][1]
        broken = _move_local(prog, second, prog.tensors[first].address)
        with pytest.raises(DeviceFault, match="over live buffer"):
            run(case, broken)
        return
    pytest.skip("no double buffer at this local memory size")


def _first(prog: Program, test) -> tuple[int, int, object]:
    """(group, command index, command) of the first command `test` accepts."""
    return next((g.index, i, c) for g in prog.groups for i, c in enumerate(g.cmds) if test(c))


def test_an_intermediate_over_a_live_operand_faults(cases: dict[str, Case]) -> None:
    # up_proj's result placed on its own input, still live (gate_proj's result too, in decode).
    case = cases["block_cache_1"]
    prog = case.net.program
    _, _, up = _first(prog, lambda c: c.loc.endswith("up_proj") and c.op != "Load")
    broken = _move_local(prog, up.result, prog.tensors[up.operands[0]].address)
    with pytest.raises(DeviceFault, match=r"writes local .* over live buffer"):
        run(case, broken)


def test_moving_a_local_buffer_to_free_bytes_changes_nothing(cases: dict[str, Case]) -> None:
    # The control for the tests above: a free place is harmless, so they see the overlap.
    case = cases["block_cache_1"]
    prog = case.net.program
    _, _, up = _first(prog, lambda c: c.loc.endswith("up_proj") and c.op != "Load")
    free = max(x.lmem_peak_bytes for x in prog.groups)
    moved = _move_local(prog, up.result, free)
    got = run(case, moved, lmem_bytes=free + (1 << 20))
    want = run(case)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_a_store_over_a_live_global_buffer_gives_wrong_numbers(cases: dict[str, Case]) -> None:
    # The store of q (group 0) redirected onto the net's input, which the residual add reads later.
    case = cases["block_1"]
    prog = case.net.program
    hidden = prog.tensors[dict(prog.inputs)["hidden_states"]]
    group, index, store = _first(prog, lambda c: c.op == "Store" and c.loc.endswith("q_rope"))
    src = prog.tensors[store.result]
    wrong = TensorDesc(src.dtype, src.shape, hidden.address)
    broken = dataclasses.replace(prog, tensors=[*prog.tensors, wrong])
    broken = _replace_cmd(broken, group, index, dataclasses.replace(store, result=len(prog.tensors)))
    got, want = run(case, broken), run(case)
    assert not np.array_equal(got["hidden_states"], want["hidden_states"])


def test_compute_on_global_memory_faults(cases: dict[str, Case]) -> None:
    case = cases["block_cache_1"]
    prog = case.net.program
    group, index, cmd = _first(prog, lambda c: c.op == "RMSNorm")
    hidden = dict(prog.inputs)["hidden_states"]
    broken = _replace_cmd(prog, group, index, dataclasses.replace(cmd, operands=(hidden, *cmd.operands[1:])))
    with pytest.raises(DeviceFault, match="compute reads local memory only"):
        run(case, broken)


# ---- the verifiers of tpu.Group, tpu.Load and tpu.Store (typed ginfo) -------------------------------


def _broken(cases: dict[str, Case], edit) -> str:
    """The grouped block_kv_0 module with `edit` applied to a copy; the verifier's message."""
    from xdsl.utils.exceptions import VerifyException

    module = cases["block_kv_0"].net.grouped.clone()
    edit(module)
    with pytest.raises(VerifyException) as err:
        module.verify()
    return str(err.value)


def _first_op(module, name: str, test=lambda op: True):
    return next(op for op in module.walk() if op.name == name and test(op))


def _with(attr, **changes):
    from xdsl.dialects.builtin import DictionaryAttr

    data = {k: v for k, v in attr.data.items() if k not in changes or changes[k] is not None}
    data.update({k: v for k, v in changes.items() if v is not None})
    return DictionaryAttr(data)


def test_the_group_verifiers_refuse_a_malformed_group(cases: dict[str, Case]) -> None:
    from xdsl.dialects.builtin import IntegerAttr, StringAttr, i64

    def mode(op):
        return op.attributes["ginfo"].data["mode"].data

    def drop_axis(m):
        op = _first_op(m, "tpu.Load", lambda o: mode(o) in ("tile", "block", "stream"))
        op.attributes["ginfo"] = _with(op.attributes["ginfo"], axis=None)

    assert "load needs an axis" in _broken(cases, drop_axis)

    def unknown_key(m):
        op = _first_op(m, "tpu.Load")
        op.attributes["ginfo"] = _with(op.attributes["ginfo"], offset=IntegerAttr(3, i64))

    assert "unknown key 'offset'" in _broken(cases, unknown_key)

    def store_stream(m):
        op = _first_op(m, "tpu.Store")
        op.attributes["ginfo"] = _with(op.attributes["ginfo"], mode=StringAttr("stream"))

    assert "expected one of whole, tile, head, got 'stream'" in _broken(cases, store_stream)

    def tile_rows_over_rows(m):
        op = _first_op(m, "tpu.Group")
        op.attributes["tile_rows"] = IntegerAttr(op.attributes["rows"].value.data + 1, i64)

    assert "tile_rows" in _broken(cases, tile_rows_over_rows)

    def compute_without_ginfo(m):
        op = _first_op(m, "tpu.MatMul") if any(o.name == "tpu.MatMul" for o in m.walk()) else \
            _first_op(m, "tpu.A16MatMul")
        del op.attributes["ginfo"]

    assert "has no ginfo" in _broken(cases, compute_without_ginfo)


def test_a_channels_first_transpose_too_large_for_local_memory_moves_in_blocks(tmp_path: Path) -> None:
    """A vision tower's convolution gives its patches channels first ([1, channels, patches]) and the tower
    turns them back ([1, patches, channels]): a 4096-patch piece of 1152 channels is 18 MiB, more than the
    chip's local memory whole. Both transposes then move alone in blocks along the permuted axis, and the
    grouped program gives the op list's bits (the input back, twice transposed)."""
    from xdsl.dialects.builtin import IntegerAttr, StringAttr, i64

    from llmbuild.codegen.vision_plan import make_vision_plan
    from llmbuild.importer.graph import TopGraph

    patches, channels = 256, 64  # 64 KiB each way in f32: a transpose whole needs 128 KiB
    # the module attributes the vision tower's import gives its net (importer/vision_tower.py)
    graph = TopGraph("vit", {"top.net": StringAttr("vit"), "top.stage": StringAttr("vision"),
                             "top.layer": IntegerAttr(-1, i64)})
    x = graph.arg("pixel_values", (1, patches, channels))
    first = graph.permute(x, (0, 2, 1), "conv.channels")
    back = graph.permute(first, (0, 2, 1), "embeddings.rows")
    w = graph.weight("scale", (channels,))  # a net has weights: one, squared apart
    module = graph.finish([back, graph.mul(w, w, "squared")], ["image_features", "squared"])
    plan = make_vision_plan(module, "f32", load_chip("bm1684x").global_alignment)
    net = compile_net(module, plan_file(plan, tmp_path), "f32", "bm1684x", tmp_path, lmem_bytes=96 * 1024)
    blocked = [c for g in net.program.groups for c in g.cmds if c.op == "Permute" and "g_piece" in c.attrs]
    assert {c.attrs["g_piece"][0] for c in blocked} == {1} and len(blocked) > 2
    rng = np.random.default_rng(7)
    inputs = {"pixel_values": rng.standard_normal((1, patches, channels)).astype(np.float32)}
    weights = {"scale": rng.standard_normal(channels).astype(np.float32)}
    run = assert_grouped_run_is_exact(Case(net, plan, weights, inputs), "vit")
    np.testing.assert_array_equal(run.outputs["image_features"], inputs["pixel_values"])


def test_a_vision_net_whose_rows_quarter_midway_is_row_tiled_over_each_count(tmp_path: Path) -> None:
    """A tower whose merger quarters its rows midway (MiniCPM-V 4.6: attention over 4096 patches, then over
    1024 merged rows): ops past the merger that do not fit whole are row-tiled over the merged count, and the
    grouped program gives the op list's bits. With the chip's memory everything fits whole and no group is
    tiled over the second count: a net that fits plans as it did with one count."""
    from xdsl.dialects.builtin import IntegerAttr, StringAttr, i64

    from llmbuild.codegen.vision_plan import make_vision_plan
    from llmbuild.importer.graph import TopGraph

    rows, width = 256, 32
    graph = TopGraph("vit", {"top.net": StringAttr("vit"), "top.stage": StringAttr("vision"),
                             "top.layer": IntegerAttr(-1, i64)})
    x = graph.arg("pixel_values", (1, rows, width))
    mask = graph.arg("attention_mask", (1, 1, rows, rows))
    qkv = [graph.reshape(graph.mul(x, graph.weight(f"encoder.{n}", (width,)), f"encoder.{n}"), (1, rows, 2, width // 2),
                         f"encoder.{n}.heads") for n in "qkv"]
    encoded = graph.add(x, graph.attention(*qkv, mask, 0.25, "encoder.attn"), "encoder.residual")
    merged = graph.reshape(encoded, (1, rows // 4, 4 * width), "merger.windows")  # four rows side by side
    w = graph.weight("merger.linear", (4 * width, 4 * width))
    scale = graph.weight("merger.scale", (4 * width,))
    projected = graph.mul(graph.linear(merged, w, None, "merger.linear"), scale, "merger.scaled")
    merged_mask = graph.arg("merged_mask", (1, 1, rows // 4, rows // 4))
    mqkv = [graph.reshape(graph.mul(projected, graph.weight(f"merged.{n}", (4 * width,)), f"merged.{n}"),
                          (1, rows // 4, 8, width // 2), f"merged.{n}.heads") for n in "qkv"]
    out = graph.add(projected, graph.attention(*mqkv, merged_mask, 0.25, "merged.attn"), "out")
    module = graph.finish([out], ["image_features"])
    rng = np.random.default_rng(11)
    weights = {"merger.linear": (rng.standard_normal((4 * width, 4 * width)) / 12).astype(np.float32),
               "merger.scale": rng.standard_normal(4 * width).astype(np.float32),
               **{f"encoder.{n}": rng.standard_normal(width).astype(np.float32) for n in "qkv"},
               **{f"merged.{n}": rng.standard_normal(4 * width).astype(np.float32) for n in "qkv"}}
    inputs = {"pixel_values": rng.standard_normal((1, rows, width)).astype(np.float32),
              "attention_mask": np.zeros((1, 1, rows, rows), np.float32),
              "merged_mask": np.zeros((1, 1, rows // 4, rows // 4), np.float32)}
    plan = make_vision_plan(module, "f32", load_chip("bm1684x").global_alignment)
    for lmem, tiled_past_merger in ((96 * 1024, True), (None, False)):
        out_dir = tmp_path / str(lmem)
        out_dir.mkdir()
        net = compile_net(module.clone(), plan_file(plan, out_dir), "f32", "bm1684x", out_dir, lmem_bytes=lmem)
        merged_groups = [g for g in net.program.groups if g.rows == rows // 4]
        assert bool(merged_groups) == tiled_past_merger
        if tiled_past_merger:
            assert all(0 < g.tile_rows < rows // 4 for g in merged_groups)
            run = assert_grouped_run_is_exact(Case(net, plan, weights, inputs), "vit")
            assert np.isfinite(run.outputs["image_features"]).all()

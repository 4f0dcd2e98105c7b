"""Flash attention: the blocked kernel (query tiles, key blocks with an online softmax) against a float64
softmax reference; the grouped device run, the op list and the interpreter agree bit for bit on nets forced
into key blocks; the simulator still faults on flash attention's buffers; `active_rows` keeps the bits;
and every sequence length up to the 1.5B's maximum compiles on every shipped chip."""

from __future__ import annotations

import dataclasses
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from helpers import plan_file, random_net_inputs
from net_cases import Case, assert_grouped_run_is_exact, assert_round_trips_and_mlir_opt_parses, load, run

from llmbuild.binary.program import Program, decode, encode
from llmbuild.chips import load_chip
from llmbuild.codegen.memory_plan import make_plan
from llmbuild.cost import hardware
from llmbuild.cost.ops import Attention
from llmbuild.cost.schedule import flash_blocks
from llmbuild.dialects import module_text
from llmbuild.dialects.interpret import interpret
from llmbuild.dialects.plain import main_func, tensor_info
from llmbuild.families.spec import ModelSpec
from llmbuild.frontend.config_spec import spec_from_hf_config_file
from llmbuild.importer.nets import ROPE_COS, ROPE_SIN, Shapes, build_block
from llmbuild.importer.rope import rope_tables
from llmbuild.numerics import masks
from llmbuild.numerics.formats import STORAGE
from llmbuild.numerics.kernels import ATTENTION_BLOCK_SCORES, KERNELS, flash_block, flash_end
from llmbuild.passes import layer_group_plan as group_plan
from llmbuild.passes import run_passes
from llmbuild.passes.assign_address import assign_addresses
from llmbuild.passes.canonicalize import Canonicalize
from llmbuild.passes.layer_group import LayerGroup, PlanLayerGroups
from llmbuild.passes.lower_top_to_tpu import LowerTopToTpu
from llmbuild.quant.scheme import scheme_for
from llmbuild.runtime.faults import DeviceFault
from llmbuild.steps.compile_net import compile_net

ROOT = Path(__file__).resolve().parent.parent
TINY = ModelSpec("qwen2", 64, 2, 4, 2, 16, 128, 512, 1e-6, 10000.0, True, True, False, 256)
MASKED = -9984.0
rng = np.random.default_rng(7)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """TPU-MLIR's cosine similarity; NaN or Inf anywhere never passes."""
    assert np.isfinite(a).all() and np.isfinite(b).all(), "NaN or Inf in a compared tensor"
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float) -> np.ndarray:
    """Softmax attention in float64, one query head at a time (head h reads KV head h // group)."""
    b, mq, qh, d = q.shape
    group = qh // k.shape[2]
    out = np.empty((b, mq, qh, d))
    for h in range(qh):
        s = q[0, :, h].astype(np.float64) @ k[0, :, h // group].T.astype(np.float64) * scale + mask[0, 0]
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        out[0, :, h] = (p / p.sum(axis=-1, keepdims=True)) @ v[0, :, h // group]
    return out.reshape(b, mq, qh * d)


def operands(stage: str, L: int, S: int, history: int, qh: int, kvh: int, d: int,
             dtype: type = np.float32) -> tuple[np.ndarray, ...]:
    """q, k, v and the stage's mask (the stage's own mask layout: history rows, then the new rows)."""
    mq = 1 if stage == "decode" else L
    mk = {"prefill": L, "prefill_kv": S + L, "decode": S + 1}[stage]
    mask = {"prefill": lambda: masks.prefill(L, L, S)[1], "prefill_kv": lambda: masks.prefill_kv(L, history, L, S)[1],
            "decode": lambda: masks.decode(history, S)[1]}[stage]()
    q = rng.standard_normal((1, mq, qh, d))
    k = rng.standard_normal((1, mk, kvh, d))
    v = rng.standard_normal((1, mk, kvh, d))
    return tuple(x.astype(dtype) for x in (q, k, v, mask))


def attrs(qh: int, kvh: int, d: int, **tiles: int) -> dict:
    return {"scale": d**-0.5, "q_head": qh, "kv_head": kvh, "dim": d, **tiles}


# ---- the kernel ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage,L,S,history,qh,kvh", [
    ("prefill", 40, 64, 0, 4, 2), ("prefill_kv", 24, 96, 37, 6, 2), ("prefill_kv", 16, 50, 0, 4, 4),
    ("decode", 1, 200, 150, 6, 3), ("decode", 1, 130, 1, 2, 1),
])
@pytest.mark.parametrize("tiles", [{}, {"tile_k": 16}, {"tile_k": 32, "tile_q": 8}, {"tile_k": 7, "tile_kvh": 1},
                                   {"tile_q": 5}], ids=["whole", "k16", "k32q8", "k7h1", "q5"])
def test_blocked_attention_matches_a_float64_softmax(stage: str, L: int, S: int, history: int, qh: int, kvh: int,
                                                     tiles: dict) -> None:
    d = 16
    q, k, v, mask = operands(stage, L, S, history, qh, kvh, d, np.float64)
    want = reference(q, k, v, mask, d**-0.5)
    got64 = KERNELS["FAttention"](attrs(qh, kvh, d, **tiles), q, k, v, mask)
    got32 = KERNELS["FAttention"](attrs(qh, kvh, d, **tiles), *(x.astype(np.float32) for x in (q, k, v, mask)))
    assert got32.dtype == np.float32 and got64.dtype == np.float64
    np.testing.assert_allclose(got64, want, rtol=1e-10, atol=1e-12)  # the online softmax is exact arithmetic
    np.testing.assert_allclose(got32, want, rtol=1e-4, atol=2e-5)
    assert cosine(got32, want) > 1 - 1e-9


def test_a_nan_never_passes_the_similarity_check() -> None:
    x = np.ones(8)
    with pytest.raises(AssertionError, match="NaN"):
        cosine(np.where(np.arange(8) == 3, np.nan, x), x)


@pytest.mark.parametrize("masked_first", [False, True])
def test_a_fully_masked_key_block_contributes_exactly_nothing(masked_first: bool) -> None:
    """Keys [visible | hidden] (or [hidden | visible]) in blocks of one half give the bits of the visible
    half alone: exp underflows to 0 and the rescale factor is exactly 1 (or the hidden block's whole
    contribution is scaled by exactly 0)."""
    d, n = 16, 32
    q = rng.standard_normal((1, 5, 4, d)).astype(np.float32)
    k = rng.standard_normal((1, 2 * n, 2, d)).astype(np.float32)
    v = rng.standard_normal((1, 2 * n, 2, d)).astype(np.float32)
    mask = np.zeros((1, 1, 5, 2 * n), np.float32)
    hidden = slice(0, n) if masked_first else slice(n, 2 * n)
    visible = slice(n, 2 * n) if masked_first else slice(0, n)
    mask[..., hidden] = MASKED
    got = KERNELS["FAttention"](attrs(4, 2, d, tile_k=n), q, k, v, mask)
    alone = KERNELS["FAttention"](attrs(4, 2, d, tile_k=n), q, k[:, visible], v[:, visible], mask[..., visible])
    np.testing.assert_array_equal(got, alone)


def test_device_blocks_compute_the_whole_ops_bits() -> None:
    """The kernel's whole-op call and the per-block calls the device makes (contiguous blocks as local
    memory holds them, the state through f32 memory) give the same bits."""
    d, qh, kvh, tq, tk = 16, 6, 3, 8, 24
    q, k, v, mask = operands("prefill_kv", 20, 60, 11, qh, kvh, d)
    a = attrs(qh, kvh, d, tile_q=tq, tile_k=tk)
    whole = KERNELS["FAttention"](a, q, k, v, mask)
    out = np.zeros_like(whole)
    for r in range(0, q.shape[1], tq):
        state = None
        for s in range(0, k.shape[1], tk):
            blocks = [np.ascontiguousarray(x) for x in (q[:, r : r + tq], k[:, s : s + tk], v[:, s : s + tk],
                                                        mask[:, :, r : r + tq, s : s + tk])]
            state = flash_block(a, *blocks, state)
            state = np.frombuffer(state.tobytes(), np.float32).reshape(state.shape)  # via local memory
        out[:, r : r + tq] = flash_end(state)
    np.testing.assert_array_equal(out, whole)


@pytest.mark.parametrize("tiles", [{"tile_q": 8, "tile_k": 16}, {"tile_q": 16}, {}], ids=["q8k16", "q16", "default"])
def test_the_same_bits_on_any_thread_count(tiles: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Query blocks run side by side (numerics/parallel.py), each whole on one thread."""
    from llmbuild.numerics.parallel import one_thread

    q, k, v, mask = operands("prefill_kv", 64, 64, 9, 4, 2, 16)
    got = []
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", threads)
        with one_thread():
            got.append(KERNELS["FAttention"](attrs(4, 2, 16, **tiles), q, k, v, mask))
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[0], got[2])


@pytest.mark.parametrize("tiles", [{"tile_q": 8, "tile_k": 16}, {"tile_k": 16}, {}], ids=["q8k16", "k16", "default"])
def test_active_rows_gives_the_same_bits_on_the_rows_it_computes(tiles: dict) -> None:
    d = 16
    q, k, v, mask = operands("prefill_kv", 40, 64, 9, 4, 2, d)
    full = KERNELS["FAttention"](attrs(4, 2, d, **tiles), q, k, v, mask)
    for active in (1, 8, 13, 40):
        got = KERNELS["FAttention"](attrs(4, 2, d, **tiles, active_rows=active), q, k, v, mask)
        assert np.isfinite(full[:, :active]).all()  # equal NaNs would pass assert_array_equal
        np.testing.assert_array_equal(got[:, :active], full[:, :active])
        # Float32 attention gives each row its own bits (numerics/attention_rows.py), with key blocks or
        # without: only the real rows are computed, the rest of their block left zero.
        assert q.dtype == np.float32
        assert not got[:, active:].any()


@pytest.mark.parametrize("stage,L,S,history,active", [
    ("prefill", 64, 64, 0, 5), ("prefill", 64, 64, 0, 64), ("prefill_kv", 40, 96, 37, 3),
    ("prefill_kv", 40, 96, 0, 17), ("decode", 1, 200, 150, 1), ("decode", 1, 130, 1, 1)])
@pytest.mark.parametrize("tiles", [{"tile_q": 8, "tile_k": 16}, {"tile_k": 16}, {"tile_k": 7, "tile_kvh": 1}],
                         ids=["q8k16", "k16", "k7h1"])
def test_skipping_the_key_blocks_the_mask_hides_keeps_the_real_rows_bits(stage: str, L: int, S: int, history: int,
                                                                         active: int, tiles: dict) -> None:
    """The host path's `hidden_key_blocks: "skip"` computes fewer key blocks and gives every real row the
    bits of the device's run over every block, the hidden keys holding large values (a padded row's K
    and V on the device are whatever its padded input gave)."""
    d = 16
    q, k, v, mask = operands(stage, L, S, history, 4, 2, d)
    hidden = mask[0, 0, :active].max(axis=0) < 0  # keys no real row sees
    k[:, hidden] *= 40.0
    v[:, hidden] *= 1e4
    rows = None if stage == "decode" else active
    full = KERNELS["FAttention"](attrs(4, 2, d, **tiles), q, k, v, mask)
    calls = []
    real_block = flash_block

    def counted(*args: np.ndarray) -> np.ndarray:
        calls.append(1)
        return real_block(*args)

    import llmbuild.numerics.kernels as kernels

    kernels.flash_block, saved = counted, kernels.flash_block
    try:
        got = KERNELS["FAttention"](attrs(4, 2, d, **tiles, active_rows=rows, hidden_key_blocks="skip"), q, k, v, mask)
    finally:
        kernels.flash_block = saved
    assert np.isfinite(full[:, :active]).all()  # equal NaNs would pass assert_array_equal
    np.testing.assert_array_equal(got[:, :active], full[:, :active])
    tq = min(tiles.get("tile_q") or L, L) if stage != "decode" else 1
    blocks_all = -(-active // tq) * (-(-k.shape[1] // tiles["tile_k"])) * (2 // tiles.get("tile_kvh", 2))
    if active < L or (stage == "decode" and history < S - tiles["tile_k"]):
        assert 0 < len(calls) < blocks_all, (len(calls), blocks_all)  # some blocks were really skipped


def test_without_tiles_attention_runs_in_bounded_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """No tile attributes (the TopOp interpreter, a net the pass did not cut): blocks of query rows hold
    at most ATTENTION_BLOCK_SCORES scores, never every query's scores against every key (on one thread
    here: each further thread holds one more block)."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    q = rng.standard_normal((1, 1024, 4, 8))
    k = rng.standard_normal((1, 8192, 2, 8))
    v = rng.standard_normal((1, 8192, 2, 8))
    mask = np.zeros((1, 1, 1024, 8192))
    whole_scores = 4 * 1024 * 8192 * 8  # bytes of every score in float64: 256 MiB
    tracemalloc.start()
    try:
        out = KERNELS["FAttention"](attrs(4, 2, 8), q, k, v, mask)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * ATTENTION_BLOCK_SCORES * 8 < whole_scores, peak  # a few block-sized temporaries
    np.testing.assert_allclose(out[:, :3], reference(q[:, :3], k, v, mask[:, :, :3], 8**-0.5), rtol=1e-10)


# ---- nets forced into key blocks ------------------------------------------------------------------------


# (S, L, local memory on a BM1688): the first cuts KV heads inside key blocks and queries into row tiles;
# the second has key blocks that straddle the history and the new rows (S = 100), in decode a block made
# of loaded history rows and the new row computed in the group; in the third, the op list's address plan
# puts a later op's result on bytes a row-tiled group still loads (the pass must cut the group there).
CONFIGS = [(128, 32, 24576), (100, 24, 16384), (64, 64, 16384)]
STAGES = {"prefill": "block_1", "prefill_kv": "block_kv_1", "decode": "block_cache_1"}
HISTORY = 37


def _case(stage: str, S: int, L: int, lmem: int, out: Path) -> Case:
    shapes = Shapes(seq_length=S, prefill_length=L)
    plan = make_plan(TINY, shapes, "bf16", 4096)
    net = compile_net(build_block(TINY, 1, stage, shapes, scheme_for("bf16", 32)), plan_file(plan, out), "bf16",
                      "bm1688", out, lmem_bytes=lmem)
    cos, sin = rope_tables(TINY, S)
    weights = {ROPE_COS: cos, ROPE_SIN: sin}
    for op in net.top.walk():
        if op.name == "top.Weight" and op.attributes["name"].data not in weights:
            shape = tensor_info(op.results[0].type).shape
            w = rng.standard_normal(shape) / np.sqrt(shape[-1])
            name = op.attributes["name"].data
            weights[name] = (1 + 0.1 * w if "norm" in name else w).astype(np.float32)
    inputs = random_net_inputs(net.top, TINY.vocab_size, L, S, HISTORY, rng)
    return Case(net, plan, weights, inputs)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple, Case]:
    out = tmp_path_factory.mktemp("flash")
    return {(stage, cfg): _case(stage, *cfg, out) for cfg in CONFIGS for stage in STAGES}


def _attention(case: Case) -> dict:
    return next(i.attrs for i in case.net.program.instrs if i.op == "FAttention")


def test_the_nets_are_cut_into_every_kind_of_block(cases: dict[tuple, Case]) -> None:
    cut = {key: _attention(c) for key, c in cases.items()}
    assert all("tile_k" in a for a in cut.values())  # every stage of every config: key blocks
    assert any(a["tile_k"] < a["mk"] and "tile_q" in a for a in cut.values())  # key blocks and query tiles
    assert any("tile_kvh" in a and "tile_k" in a for a in cut.values())  # KV-head blocks inside key blocks
    cmds = [(key, c) for key, case in cases.items() for g in case.net.program.groups for c in g.cmds]
    straddles = {key[0] for key, c in cmds if c.op == "Concat" and len(c.operands) == 2}
    assert straddles == {"prefill_kv", "decode"}  # a block of history rows and new rows
    masks_2d = [c for _, c in cmds if c.op == "Load" and isinstance(c.attrs["axis"], list)]
    assert masks_2d and all(c.attrs["axis"] == [2, 3] for c in masks_2d)


@pytest.mark.parametrize("cfg", CONFIGS, ids=[f"S{s}-L{n}" for s, n, _ in CONFIGS])
@pytest.mark.parametrize("stage", list(STAGES))
def test_grouped_run_equals_op_list_and_interpretation_bit_for_bit(cases: dict[tuple, Case], stage: str,
                                                                   cfg: tuple) -> None:
    case = cases[(stage, cfg)]
    assert 0 < max(g.lmem_peak_bytes for g in case.net.program.groups) <= cfg[2]
    want = assert_grouped_run_is_exact(case, stage)  # every op, the concats reassembled from key blocks
    # and the float64 TopOp reference (no tiles: bounded query blocks, exact softmax) agrees
    top = interpret(case.net.top, case.inputs, case.weights.__getitem__, reference=True)
    for out in top.outputs:
        assert cosine(want.outputs[out], top.outputs[out]) > 0.9999, (stage, out)


def _global_bytes(prog: Program, cmd) -> tuple[int, int]:
    """The global bytes a Load reads or a Store writes: its rows for a slice along axis 1, else (a whole
    tensor, or a slice along other axes) every byte of the global tensor."""
    g, local = ((prog.tensors[cmd.operands[0]], prog.tensors[cmd.result]) if cmd.op == "Load"
                else (prog.tensors[cmd.result], prog.tensors[cmd.operands[0]]))
    size = STORAGE[g.dtype][0] * int(np.prod(g.shape))
    if cmd.attrs["axis"] == 1 and g.shape[0] == 1:
        row = size // g.shape[1]
        return g.address + cmd.attrs["start"] * row, g.address + (cmd.attrs["start"] + local.shape[1]) * row
    return g.address, g.address + size


def _stores_before_loads_of_the_same_bytes(prog: Program) -> list[tuple[int, int, int]]:
    """(group, store, load) where a Store of a group writes global bytes a later Load of the group reads."""
    bad = []
    for g in prog.groups:
        written: list[tuple[int, int, int]] = []
        for i, c in enumerate(g.cmds):
            if c.op in ("Load", "Store"):
                lo, hi = _global_bytes(prog, c)
                if c.op == "Store":
                    written.append((lo, hi, i))
                else:
                    bad += [(g.index, s, i) for a, b, s in written if a < hi and lo < b]
    return bad


@pytest.mark.parametrize("cfg", CONFIGS, ids=[f"S{s}-L{n}" for s, n, _ in CONFIGS])
def test_no_group_stores_over_bytes_it_loads_later(cases: dict[tuple, Case], cfg: tuple) -> None:
    for stage in STAGES:
        assert _stores_before_loads_of_the_same_bytes(cases[(stage, cfg)].net.program) == [], stage


def test_flash_commands_survive_the_binary_encoding(cases: dict[tuple, Case]) -> None:
    case = cases[("prefill_kv", CONFIGS[1])]
    prog = case.net.program
    back = decode(encode(prog))
    assert back.groups == prog.groups
    got, want = run(case, back), run(case)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_grouped_flash_ir_parses_back_and_with_upstream_mlir_opt(cases: dict[tuple, Case]) -> None:
    text = module_text(cases[("prefill_kv", CONFIGS[1])].net.grouped)
    for part in ('mode = "block"', "row_axis = 2", "state = array<i64", "tile_k = ", "tile_q = ", "key_block = "):
        assert part in text, part
    assert_round_trips_and_mlir_opt_parses(text)


# ---- faults ------------------------------------------------------------------------------------------------


def _with_cmds(prog: Program, group: int, cmds: list) -> Program:
    groups = list(prog.groups)
    groups[group] = dataclasses.replace(groups[group], cmds=cmds)
    return dataclasses.replace(prog, groups=groups)


def _move(prog: Program, tensor: int, address: int) -> Program:
    buffer, delta = prog.tensors[tensor].buffer, address - prog.tensors[tensor].address
    tensors = [dataclasses.replace(t, address=t.address + delta) if t.local and t.buffer == buffer else t
               for t in prog.tensors]
    return dataclasses.replace(prog, tensors=tensors)


def _flash_group(prog: Program) -> int:
    return next(g.index for g in prog.groups if any(c.attrs.get("g_flash") for c in g.cmds))


def test_key_block_slots_that_coincide_fault(cases: dict[tuple, Case]) -> None:
    # The next key block's history rows loaded onto the block still to be read.
    case = cases[("prefill_kv", CONFIGS[0])]
    prog = case.net.program
    g = prog.groups[_flash_group(prog)]
    loads = [c.result for c in g.cmds if c.op == "Load" and c.loc == "history_k"]
    assert prog.tensors[loads[0]].address != prog.tensors[loads[1]].address
    with pytest.raises(DeviceFault, match=r"block_kv_1: group \d+: command \d+ \(Load history_k\): .*over live buffer"):
        run(case, _move(prog, loads[1], prog.tensors[loads[0]].address))


def test_the_state_over_a_live_key_block_faults(cases: dict[tuple, Case]) -> None:
    case = cases[("decode", CONFIGS[1])]
    prog = case.net.program
    g = prog.groups[_flash_group(prog)]
    block = next(c for c in g.cmds if c.attrs.get("g_flash") == "block")
    broken = _move(prog, block.result, prog.tensors[block.operands[1]].address)
    with pytest.raises(DeviceFault, match=r"writes local .* over live buffer"):
        run(case, broken)


def test_a_key_block_never_loaded_is_an_unwritten_read(cases: dict[tuple, Case]) -> None:
    case = cases[("decode", CONFIGS[0])]
    prog = case.net.program
    gi = _flash_group(prog)
    cmds = list(prog.groups[gi].cmds)
    first = next(i for i, c in enumerate(cmds) if c.op == "Load" and c.loc == "history_v")
    del cmds[first]
    with pytest.raises(DeviceFault, match=r"Concat .*v_concat.*before anything in this group wrote it"):
        run(case, _with_cmds(prog, gi, cmds))


def test_flash_groups_fault_past_the_end_of_local_memory(cases: dict[tuple, Case]) -> None:
    case = cases[("prefill", CONFIGS[1])]
    prog = case.net.program
    peak = max(g.lmem_peak_bytes for g in prog.groups)
    run(case, lmem_bytes=peak)  # exactly enough
    with pytest.raises(DeviceFault, match="beyond local memory"):
        run(case, lmem_bytes=peak - 512)


def test_a_mask_tile_from_the_wrong_rows_gives_wrong_numbers(cases: dict[tuple, Case]) -> None:
    case = cases[("prefill", CONFIGS[0])]
    prog = case.net.program
    gi = _flash_group(prog)
    cmds = list(prog.groups[gi].cmds)
    i = next(i for i, c in enumerate(cmds) if c.op == "Load" and c.attrs["axis"] == [2, 3] and c.attrs["start"][0])
    cmds[i] = dataclasses.replace(cmds[i], attrs={**cmds[i].attrs, "start": [0, cmds[i].attrs["start"][1]]})
    got, want = run(case, _with_cmds(prog, gi, cmds)), run(case)
    assert not np.array_equal(got["hidden_states"], want["hidden_states"])


def test_a_mask_tile_past_the_mask_faults(cases: dict[tuple, Case]) -> None:
    case = cases[("prefill_kv", CONFIGS[1])]
    prog = case.net.program
    gi = _flash_group(prog)
    cmds = list(prog.groups[gi].cmds)
    i = next(i for i, c in enumerate(cmds) if c.op == "Load" and c.attrs["axis"] == [2, 3])
    mask = prog.tensors[cmds[i].operands[0]]
    cmds[i] = dataclasses.replace(cmds[i], attrs={**cmds[i].attrs, "start": [0, mask.shape[3] - 1]})
    with pytest.raises(DeviceFault, match=r"slice .* on axis 3 .* does not match"):
        run(case, _with_cmds(prog, gi, cmds))


def test_moving_the_state_to_free_bytes_changes_nothing(cases: dict[tuple, Case]) -> None:
    # The control for the fault tests: a free place is harmless.
    case = cases[("prefill_kv", CONFIGS[0])]
    prog = case.net.program
    g = prog.groups[_flash_group(prog)]
    states = {c.result for c in g.cmds if c.attrs.get("g_flash") == "block"}
    free = max(x.lmem_peak_bytes for x in prog.groups)
    moved = prog
    for t in states:
        moved = _move(moved, t, free)
    got, want = run(case, moved, lmem_bytes=free + (1 << 16)), run(case)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


# ---- every length on every chip -------------------------------------------------------------------------

SPEC_15B = ROOT / "recipes" / "configs" / "deepseek_r1_distill_qwen_1_5b.json"
LENGTHS = [(S, L) for S in (2048, 8192, 32768, 131072) for L in (128, 2048)] + [(8192, 8192)]
CHIPS = sorted(p.stem for p in (ROOT / "llmbuild" / "chips" / "data").glob("*.yaml"))


def _grouped(spec: ModelSpec, S: int, L: int, mode: str = "w4bf16") -> dict[tuple[str, str], object]:
    """The 1.5B's three block nets at S, L through canonicalize, lower-top-to-tpu, assign-address and
    layer-group, for every chip (no weights are needed to plan)."""
    shapes = Shapes(seq_length=S, prefill_length=L)
    plan = make_plan(spec, shapes, mode, 4096, 64)
    out = {}
    for stage in STAGES:
        top = build_block(spec, 3, stage, shapes, scheme_for(mode, 64))
        run_passes(top, [Canonicalize()])
        for chip in CHIPS:
            module = top.clone()
            run_passes(module, [LowerTopToTpu(mode=mode, chip=chip)])
            assign_addresses(module, plan)
            run_passes(module, [PlanLayerGroups(chip=chip), LayerGroup()])
            module.verify()
            out[(stage, chip)] = module
    return out


@pytest.fixture(scope="module")
def spec_15b() -> ModelSpec:
    return spec_from_hf_config_file(SPEC_15B)


@pytest.mark.parametrize("S,L", LENGTHS, ids=[f"S{s}-L{n}" for s, n in LENGTHS])
def test_every_length_compiles_on_every_chip(spec_15b: ModelSpec, S: int, L: int) -> None:
    assert spec_15b.max_position_embeddings >= S and {"bm1684x", "bm1688", "cv186x"} <= set(CHIPS)
    for (stage, chip), module in _grouped(spec_15b, S, L).items():
        lmem = load_chip(chip).lmem_bytes
        groups = [op for op in main_func(module).body.block.ops if op.name == "tpu.Group"]
        assert groups, (stage, chip)
        for g in groups:
            peak = g.attributes["lmem_peak_bytes"].value.data
            assert 0 < peak <= lmem, (S, L, stage, chip, peak)
        att = next(op for g in groups for op in g.body.block.ops if op.name == "tpu.FAttention")
        if stage != "prefill" and S >= 8192:  # a history this long is never held whole
            assert "tile_k" in att.attributes, (S, L, stage, chip)


def test_the_spec_model_cuts_attention_as_the_pass_does(spec_15b: ModelSpec) -> None:
    """The spec model's flash attention (query tiles: K/V re-reads; key blocks: rescaling) is the layer-group
    pass's, for the prefill stages (decode's attention shares its group with the whole layer, which the
    per-op model does not see; there the blocks only add vector work, and K/V are read once)."""
    assert hardware.FLASH_KEY_BLOCK == group_plan.KEY_BLOCK_MIN
    assert hardware.FLASH_ROW_BLOCK == group_plan.ROW_BLOCK
    assert hardware.FLASH_MAX_ROW_TILE == group_plan.MAX_ROW_TILE
    assert hardware.FLASH_STATE_BYTES == group_plan.STATE_BYTES
    for S, L in ((2048, 2048), (8192, 8192)):
        for (stage, chip), module in _grouped(spec_15b, S, L).items():
            if stage == "decode":
                continue
            group = next(op for op in main_func(module).body.block.ops if op.name == "tpu.Group"
                         and any(x.name == "tpu.FAttention" for x in op.body.block.ops))
            att = next(x for x in group.body.block.ops if x.name == "tpu.FAttention")
            mq, mk = att.attributes["mq"].value.data, att.attributes["mk"].value.data
            rows = group.attributes["tile_rows"].value.data or mq
            keys = att.attributes["tile_k"].value.data if "tile_k" in att.attributes else mk
            model = Attention(mq, mk, spec_15b.num_heads, spec_15b.num_kv_heads, spec_15b.head_dim, 2)
            assert flash_blocks(model, load_chip(chip).lmem_bytes) == (-(-mq // rows), -(-mk // keys)), \
                (S, L, stage, chip)


def test_a_history_too_long_for_any_block_fails_naming_the_attention(tmp_path: Path) -> None:
    shapes = Shapes(seq_length=80, prefill_length=48)
    plan = make_plan(TINY, shapes, "bf16", 4096)
    with pytest.raises(Exception, match=r"block_kv_0: layers\.0\.attention: does not fit local memory \(12288"):
        compile_net(build_block(TINY, 0, "prefill_kv", shapes), plan_file(plan, tmp_path), "bf16", "bm1688", tmp_path,
                    lmem_bytes=12288)


@pytest.mark.parametrize("cfg", CONFIGS, ids=[f"S{s}-L{n}" for s, n, _ in CONFIGS])
@pytest.mark.parametrize("stage", ["prefill", "prefill_kv"])
def test_a_check_of_a_few_tokens_runs_only_their_row_tiles(cases: dict[tuple, Case], stage: str, cfg: tuple) -> None:
    """The build checks a few real tokens of a long static prefill on the device: the row-tiled groups run
    the tiles that hold them (two at least), and those rows keep the bits of the whole run."""
    case = cases[(stage, cfg)]
    prog = case.net.program
    full = run(case)
    dev = load(case)
    dev.run(prog, active_rows=1)
    tiles = [g.tile_rows for g in prog.groups if g.tile_rows and g.rows > 2 * g.tile_rows]
    if not tiles:
        pytest.skip("no group with more than two row tiles in this configuration")
    assert any(c.attrs.get("g_tile", 0) >= 2 for g in prog.groups for c in g.cmds)  # there is work to skip
    kept = 2 * min(tiles)
    for out, _ in prog.outputs:
        got = dev.get_output(prog, out)
        np.testing.assert_array_equal(got[:, :kept], full[out][:, :kept], err_msg=f"{stage} {out}")

"""The simulated device runs compiled programs exactly as the tpu interpretation says, and faults on
writes where nothing may be written."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import plan_file, random_net_inputs
from net_cases import Case, load, run

from llmbuild import LlmbuildError
from llmbuild.binary.program import Program, TensorDesc
from llmbuild.codegen.memory_plan import make_plan
from llmbuild.dialects.interpret import interpret
from llmbuild.dialects.plain import tensor_info
from llmbuild.families.spec import ModelSpec
from llmbuild.importer.nets import ROPE_COS, ROPE_SIN, Shapes, build_block, head_nets
from llmbuild.importer.rope import rope_tables
from llmbuild.numerics.formats import STORAGE
from llmbuild.runtime.faults import DeviceFault
from llmbuild.steps.compile_net import CompiledNet, compile_net

SPEC = ModelSpec("qwen2", 64, 2, 4, 2, 16, 128, 512, 1e-6, 10000.0, True, True, False, 256)
SHAPES = Shapes(seq_length=16, prefill_length=4)
HISTORY = 6  # cached rows before the prefill_kv / decode call


def _weights(c: CompiledNet, rng: np.random.Generator) -> dict[str, np.ndarray]:
    cos, sin = rope_tables(SPEC, SHAPES.seq_length)
    out = {ROPE_COS: cos, ROPE_SIN: sin}
    for op in c.top.walk():
        if op.name == "top.Weight" and op.attributes["name"].data not in out:
            shape = tensor_info(op.results[0].type).shape
            w = rng.standard_normal(shape) / np.sqrt(shape[-1])
            out[op.attributes["name"].data] = (1 + 0.1 * w if "norm" in op.attributes["name"].data else w).astype(
                np.float32
            )
    return out


def _inputs(c: CompiledNet, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return random_net_inputs(c.top, SPEC.vocab_size, SHAPES.prefill_length, SHAPES.seq_length, HISTORY, rng)


NET_NAMES = ["block_1", "block_kv_0", "block_cache_1", "embedding", "embedding_cache", "lm_head"]


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    plan = make_plan(SPEC, SHAPES, "bf16", 4096)
    out = tmp_path_factory.mktemp("nets")
    modules = {
        "block_1": build_block(SPEC, 1, "prefill", SHAPES),
        "block_kv_0": build_block(SPEC, 0, "prefill_kv", SHAPES),
        "block_cache_1": build_block(SPEC, 1, "decode", SHAPES),
        **head_nets(SPEC, SHAPES),
    }
    rng = np.random.default_rng(7)
    result = {}
    for name, module in modules.items():
        c = compile_net(module, plan_file(plan, out), "bf16", "bm1684x", out)
        result[name] = Case(c, plan, _weights(c, rng), _inputs(c, rng))
    return result


def with_address(prog: Program, tensor: int, address: int) -> Program:
    """The program with one global tensor moved: its layer groups store and load it at `address`. The
    same faults in local memory are tests/test_layer_group.py's."""
    tensors = list(prog.tensors)
    tensors[tensor] = dataclasses.replace(tensors[tensor], address=address)
    return dataclasses.replace(prog, tensors=tensors)


def _nbytes(t: TensorDesc) -> int:
    return STORAGE[t.dtype][0] * (int(np.prod(t.shape)) if t.shape else 1)


def stored(prog: Program) -> list[tuple[int, int]]:
    """(group, global tensor) of every Store, in issue order: the values that cross a group boundary."""
    return [(g.index, c.result) for g in prog.groups for c in g.cmds if c.op == "Store"]


def loaded(prog: Program) -> list[tuple[int, int]]:
    """(group, global tensor) of every Load."""
    return [(g.index, c.operands[0]) for g in prog.groups for c in g.cmds if c.op == "Load"]


def live_pair(prog: Program) -> tuple[int, int]:
    """(a, b): `a` is stored by one group and loaded by a later one, and `b` is stored in between (by
    the storing group or a group before the reader), while `a` still waits for its reader."""
    loads = loaded(prog)
    for g_a, a in stored(prog):
        readers = [g for g, t in loads if t == a and g > g_a]
        if not readers:
            continue
        for g_b, b in stored(prog):
            if b != a and g_a <= g_b < min(readers) and _nbytes(prog.tensors[b]) >= _nbytes(prog.tensors[a]):
                return a, b
    raise AssertionError(f"{prog.net}: no value is stored while another waits for its reader")


@pytest.mark.parametrize("name", NET_NAMES)
def test_device_equals_tpu_interpretation_bit_exactly(cases: dict[str, Case], name: str) -> None:
    case = cases[name]
    want = interpret(case.net.tpu, case.inputs, case.weights.__getitem__, reference=False)
    prog = case.net.program
    dev = load(case)
    traced: dict[str, np.ndarray] = {}
    dev.run(prog, trace=lambda loc, value: traced.__setitem__(loc, value.copy()))
    for out_name, _ in prog.outputs:
        got = dev.get_output(prog, out_name)
        np.testing.assert_array_equal(got, want.outputs[out_name], err_msg=f"{name} {out_name}")
    # op by op too: a difference shows up where it starts, not only at the outputs
    assert list(traced) == [i.loc for i in prog.instrs]
    for loc, value in traced.items():
        np.testing.assert_array_equal(value, want.by_loc[loc], err_msg=f"{name} {loc}")


def test_a_program_without_layer_groups_is_refused(cases: dict[str, Case]) -> None:
    # The device runs layer groups only; the op list alone is the host's and the interpreter's.
    case = cases["block_1"]
    prog = dataclasses.replace(case.net.program, groups=[])
    with pytest.raises(LlmbuildError, match="no layer groups"):
        load(case, prog).run(prog)


def test_bf16_outputs_are_bf16_values_and_logits_are_not(cases: dict[str, Case]) -> None:
    # bf16 values have zero low mantissa halves; f32 logits generally do not. This is what makes
    # "bit-exact" above a statement about rounding, not only about arithmetic.
    hidden = run(cases["block_1"])["hidden_states"]
    assert not np.any(hidden.view(np.uint32) & 0xFFFF)
    logits = run(cases["lm_head"])["logits"]
    assert np.count_nonzero(logits.view(np.uint32) & 0xFFFF) > logits.size // 2


def test_overlapping_a_live_buffer_changes_the_output(cases: dict[str, Case]) -> None:
    case = cases["block_1"]
    prog = case.net.program
    correct = run(case)
    want = interpret(case.net.tpu, case.inputs, case.weights.__getitem__, reference=False)
    np.testing.assert_array_equal(correct["hidden_states"], want.outputs["hidden_states"])
    # `b` stored over the bytes of `a`, which a later group still has to load: a live value clobbered
    a, b = live_pair(prog)
    got = run(case, with_address(prog, b, prog.tensors[a].address))
    assert not np.array_equal(got["hidden_states"], correct["hidden_states"])


def test_moving_to_free_bytes_changes_nothing(cases: dict[str, Case]) -> None:
    # The control: moving the same value to bytes no other value uses is harmless, so the test above
    # sees the overlap, not just any change of address.
    case = cases["block_1"]
    prog = case.net.program
    _, b = live_pair(prog)
    free = case.plan.activation_base + prog.activation_bytes  # past the net's activation peak
    moved = with_address(prog, b, free)
    dev = load(case, moved, extra=_nbytes(prog.tensors[b]))
    dev.run(moved)
    correct = run(case)
    for name, _ in prog.outputs:
        np.testing.assert_array_equal(dev.get_output(moved, name), correct[name])


def test_write_into_weight_region_faults(cases: dict[str, Case]) -> None:
    case = cases["block_kv_0"]
    prog = case.net.program
    _, target = stored(prog)[0]
    lo, size = case.plan.regions["weight"]
    q_weight = case.plan.weights["layers.0.self_attn.q_proj.weight"]
    for address in (q_weight.address, lo + size - 2):  # inside, and straddling the region's end
        dev = load(case)
        before = dev.mem[lo : lo + size].copy()
        with pytest.raises(DeviceFault, match="weight region"):
            dev.run(with_address(prog, target, address))
        assert np.array_equal(dev.mem[lo : lo + size], before)  # refused before any byte was written
    dev = load(case)
    with pytest.raises(DeviceFault, match="weight region"):
        dev.write(TensorDesc("f32", (4,), q_weight.address), np.zeros(4, np.float32))


def test_address_past_end_of_memory_faults(cases: dict[str, Case]) -> None:
    case = cases["block_cache_1"]
    prog = case.net.program
    _, target = stored(prog)[0]
    size = load(case).mem.size
    for address in (size, size - 16, size + (1 << 30)):  # the store straddles or lies beyond the end
        dev = load(case)
        with pytest.raises(DeviceFault, match="outside device memory"):
            dev.run(with_address(prog, target, address))
    # a load past the end faults too
    _, operand = next((g, t) for g, t in loaded(prog) if not prog.tensors[t].local)
    dev = load(case)
    with pytest.raises(DeviceFault, match="outside device memory"):
        dev.run(with_address(prog, operand, size - 4))
    assert issubclass(DeviceFault, LlmbuildError)  # the CLI reports it as one line


def test_device_sized_by_plan_has_room_for_every_tensor(cases: dict[str, Case]) -> None:
    # The device the build sizes (activation base + the net's activation peak) holds every tensor.
    for case in cases.values():
        prog = case.net.program
        size = case.plan.activation_base + prog.activation_bytes
        for t in prog.tensors:
            count = int(np.prod(t.shape)) if t.shape else 1
            nbytes = {"f32": 4, "i32": 4, "bf16": 2, "f16": 2}[t.dtype] * count
            assert t.address + nbytes <= size, (prog.net, t)

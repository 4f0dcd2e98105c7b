"""The passes: FileCheck-style golden files in tests/filecheck/, and properties over every net and mode.

Each golden case runs one pipeline on `<input>.mlir` and compares the printed module with the expected
file beside it, exactly. The expected files were reviewed by hand; the semantic checks below each case
say what the review established, so a golden regenerated with a regression in it still fails.
After an intended change of a pass, regenerate with `LLMBUILD_UPDATE_GOLDEN=1 pytest tests/test_passes.py`
and review the diff.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from helpers import random_net_inputs
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, TensorType, i64
from xdsl.ir import Operation, SSAValue
from xdsl.passes import PassPipeline
from xdsl.rewriter import Rewriter

from llmbuild import LlmbuildError
from llmbuild.binary.memory_map import ACTIVATION_ALIGN, MemoryPlan, align
from llmbuild.codegen.memory_plan import make_plan
from llmbuild.dialects import module_text, read_module
from llmbuild.dialects.interpret import interpret
from llmbuild.dialects.plain import main_func, string_list, tensor_info
from llmbuild.families.spec import ModelSpec
from llmbuild.importer.nets import ROPE_COS, ROPE_SIN, STAGES, Shapes, build_block, head_nets
from llmbuild.importer.rope import rope_tables
from llmbuild.numerics.formats import itemsize
from llmbuild.passes import pipeline_string, run_passes
from llmbuild.passes.assign_address import AssignAddress, assign_addresses
from llmbuild.passes.canonicalize import Canonicalize
from llmbuild.passes.lower_top_to_tpu import LowerTopToTpu
from llmbuild.passes.pipeline import PASSES

FILECHECK = Path(__file__).parent / "filecheck"
# The model the filecheck inputs are cut from: hidden 16, 2 heads of 8 (1 KV head), MLP 32, vocab 64.
FILECHECK_SPEC = ModelSpec("llama", 16, 1, 2, 1, 8, 32, 64, 1e-6, 10000.0, False, False, False, 64)
FILECHECK_SHAPES = Shapes(seq_length=8, prefill_length=4)


def ops_of(module: ModuleOp) -> list[Operation]:
    return [op for op in main_func(module).body.block.ops if not isinstance(op, func.ReturnOp)]


def by_loc(module: ModuleOp) -> dict[str, Operation]:
    return {op.attributes["loc"].data: op for op in ops_of(module)}


def dtype(value: SSAValue) -> str:
    return tensor_info(value.type).dtype


def address(value: SSAValue) -> int:
    addr = tensor_info(value.type).address
    assert addr is not None, f"{value} has no address"
    return addr


# ---- the golden files -----------------------------------------------------------------------------


def check_canonicalize(m: ModuleOp, plan: MemoryPlan) -> None:
    locs = [op.attributes["loc"].data for op in ops_of(m)]
    # identity reshapes and the undone reshape pair are gone, the chain is one reshape, dead ops dropped
    assert locs == [
        "hidden_states",
        "layers.0.input_layernorm.weight",
        "norm",
        "heads",
        "residual",
        "residual_heads",
    ]
    ops = by_loc(m)
    assert ops["heads"].operands[0] is ops["norm"].results[0]
    assert ops["residual"].operands[0] is ops["norm"].results[0]
    assert ops["residual_heads"].operands[0] is ops["residual"].results[0]


def check_lower_block(mode: str) -> Callable[[ModuleOp, MemoryPlan], None]:
    def check(m: ModuleOp, plan: MemoryPlan) -> None:
        ops = by_loc(m)
        assert not [
            op.name for op in ops_of(m) if op.name.startswith("top.") and op.name[4:] not in ("Input", "Weight")
        ]
        # RoPE tables and everything gathered from them stay f32
        for loc in ("rope.cos", "rope.sin", "cos_gather", "sin_gather", "cos_heads", "sin_heads"):
            assert dtype(ops[loc].results[0]) == "f32", loc
        rope = ops["q_rope"]
        assert [dtype(v) for v in rope.operands] == [mode, "f32", "f32"]
        assert dtype(rope.results[0]) == mode
        silu = ops["gate_silu"]
        assert silu.name == "tpu.Active" and silu.attributes["mode"].data == "SILU"
        for loc in (
            "q_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
            "gate_mul",
            "mlp_residual",
            "hidden_states",
        ):
            assert dtype(ops[loc].results[0]) == mode, loc
        assert dtype(ops["layers.0.mlp.gate_proj.weight"].results[0]) == mode
        assert dtype(ops["position_ids"].results[0]) == "i32"
        assert m.attributes["tpu.mode"].data == mode

    return check


def check_lower_lm_head(m: ModuleOp, plan: MemoryPlan) -> None:
    ops = by_loc(m)
    assert dtype(ops["lm_head"].results[0]) == "f32"  # logits keep the f32 accumulator
    assert [dtype(v) for v in ops["lm_head"].operands] == ["bf16", "bf16"]
    assert dtype(ops["final_norm"].results[0]) == "bf16"
    fn = main_func(m)
    assert [tensor_info(t).dtype for t in fn.function_type.outputs.data] == ["f32"]
    assert [tensor_info(t).dtype for t in fn.function_type.inputs.data] == ["bf16"]


def check_assign_address(m: ModuleOp, plan: MemoryPlan) -> None:
    assert address_violations(m, plan) == []
    ops = by_loc(m)
    for view, source in (
        ("q_heads", "q_proj"),
        ("k_heads", "k_proj"),
        ("q_flat", "q_rope"),
        ("cos_heads", "cos_gather"),
    ):
        assert address(ops[view].results[0]) == address(ops[source].results[0])
    assert address(ops["k_rope"].results[0]) == plan.io["present_k"].address
    assert address(ops["mlp_residual"].results[0]) == plan.io["hidden.1"].address
    assert address(ops["hidden_states"].results[0]) == plan.io["hidden.0"].address
    # k_proj is born after q_proj's last reader (q_rope) ran: it reuses q_proj's bytes
    assert address(ops["k_proj"].results[0]) == address(ops["q_proj"].results[0])
    assert m.attributes["tpu.activation_bytes"].value.data == 4 * 64  # cos, sin, q/k, q_rope at 64 B each


@dataclass(frozen=True)
class Golden:
    source: str
    pipeline: str  # an xDSL pipeline string; {plan} is replaced by the plan's path
    expected: str
    check: Callable[[ModuleOp, MemoryPlan], None]


GOLDEN = [
    Golden("canonicalize.mlir", "canonicalize", "canonicalize.expected.mlir", check_canonicalize),
    Golden(
        "lower_block.mlir",
        'lower-top-to-tpu{mode="bf16"}',
        "lower_block.bf16.expected.mlir",
        check_lower_block("bf16"),
    ),
    Golden(
        "lower_block.mlir",
        'lower-top-to-tpu{mode="f16"}',
        "lower_block.f16.expected.mlir",
        check_lower_block("f16"),
    ),
    Golden(
        "lower_lm_head.mlir",
        'lower-top-to-tpu{mode="bf16"}',
        "lower_lm_head.bf16.expected.mlir",
        check_lower_lm_head,
    ),
    Golden(
        "assign_address.mlir",
        'assign-address{plan="{plan}"}',
        "assign_address.expected.mlir",
        check_assign_address,
    ),
]


@pytest.fixture(scope="module")
def filecheck_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[MemoryPlan, Path]:
    plan = make_plan(FILECHECK_SPEC, FILECHECK_SHAPES, "bf16", 4096)
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(plan.to_json())
    return plan, path


@pytest.mark.parametrize("case", GOLDEN, ids=lambda g: g.expected.removesuffix(".expected.mlir"))
def test_golden(case: Golden, filecheck_plan: tuple[MemoryPlan, Path]) -> None:
    plan, plan_path = filecheck_plan
    module = read_module(FILECHECK / case.source)
    passes = list(PassPipeline.parse_spec(PASSES, case.pipeline.replace("{plan}", str(plan_path))).passes)
    run_passes(module, passes)
    got = module_text(module)
    expected_path = FILECHECK / case.expected
    if os.environ.get("LLMBUILD_UPDATE_GOLDEN"):
        expected_path.write_text(got)
    want = expected_path.read_text()
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "expected", "got"))
        pytest.fail(f"{case.source} | {case.pipeline} differs from {case.expected}:\n{diff}")
    case.check(module, plan)


def test_golden_inputs_are_what_the_passes_expect() -> None:
    # The inputs must be valid modules in the dialect their pass reads; the lowering inputs must not
    # contain tpu ops, assign-address's input must be fully lowered and have no addresses yet.
    for case in GOLDEN:
        module = read_module(FILECHECK / case.source)
        names = {op.name.split(".")[0] for op in ops_of(module)}
        if case.source.startswith(("canonicalize", "lower")):
            assert names == {"top"}, case.source
        else:
            assert {op.name for op in ops_of(module) if op.name.startswith("top.")} <= {
                "top.Input",
                "top.Weight",
            }
            assert all(tensor_info(op.results[0].type).address is None for op in ops_of(module))


def test_pipeline_string_round_trips() -> None:
    passes = [Canonicalize(), LowerTopToTpu(mode="f16", chip="bm1688"), AssignAddress(plan="/x/plan.json")]
    text = pipeline_string(passes)
    assert text == 'canonicalize,lower-top-to-tpu{mode="f16" chip="bm1688"},assign-address{plan="/x/plan.json"}'
    assert list(PassPipeline.parse_spec(PASSES, text).passes) == passes


def test_lowering_rejects_unknown_mode() -> None:
    module = read_module(FILECHECK / "lower_lm_head.mlir")
    with pytest.raises(LlmbuildError, match="mode 'int4'"):
        run_passes(module, [LowerTopToTpu(mode="int4")])


# ---- an independent check of assigned addresses ---------------------------------------------------


def address_violations(module: ModuleOp, plan: MemoryPlan) -> list[str]:
    """Everything wrong with a module's addresses, computed without the pass's own liveness code.

    A buffer is a value together with its views (top.Input of an argument, tpu.Reshape of a value): a
    view must have its source's address. A buffer is live from its definition (arguments: from entry)
    to its last reader, through any view (returned values: to the end). Two buffers that are live at
    the same op must not share a byte, and every buffer must lie in the region the plan gives it.
    """
    problems: list[str] = []
    fn = main_func(module)
    block = fn.body.block
    ops = list(block.ops)
    end = len(ops)
    net = module.attributes["top.net"].data
    layer = module.attributes["top.layer"].value.data
    source: dict[SSAValue, SSAValue] = {}

    def root(v: SSAValue) -> SSAValue:
        while v in source:
            v = source[v]
        return v

    born: dict[SSAValue, int] = {a: -1 for a in block.args}
    last: dict[SSAValue, int] = {a: -1 for a in block.args}
    size: dict[SSAValue, int] = {}
    kind: dict[SSAValue, str] = {a: "io" for a in block.args}
    names: dict[SSAValue, str] = {}
    for i, op in enumerate(ops):
        for v in op.operands:
            r = root(v)
            last[r] = max(last.get(r, i), i if not isinstance(op, func.ReturnOp) else end)
        if isinstance(op, func.ReturnOp):
            continue
        result = op.results[0]
        if op.name in ("top.Input", "tpu.Reshape"):
            source[result] = op.operands[0]
            if address(result) != address(op.operands[0]):
                loc, here, there = op.attributes["loc"].data, address(result), address(op.operands[0])
                problems.append(f"{loc}: view at {here}, source at {there}")
            continue
        if op.name == "top.Weight":
            kind[result], names[result] = "weight", op.attributes["name"].data
            born[result], last[result] = -1, end  # weights are read-only and always there
        else:
            kind[result], names[result] = "activation", op.attributes["loc"].data
            born[result], last[result] = i, i
    for r in born:
        size[r] = max(_nbytes(v) for v in [r, *[v for v in source if root(v) is r]])

    ret = ops[-1]
    assert isinstance(ret, func.ReturnOp)
    for name, v in zip(string_list(fn.attributes["result_names"]), ret.operands, strict=True):
        r = root(v)
        kind[r], names[r] = "io", f"output {name}"
    for name, a in zip(string_list(fn.attributes["arg_names"]), block.args, strict=True):
        names[a] = f"input {name}"

    act_lo = plan.activation_base
    act_hi = act_lo + module.attributes["tpu.activation_bytes"].value.data
    for r in born:
        lo, hi = address(r), address(r) + size[r]
        if kind[r] == "weight":
            slot = plan.weights[names[r]]
            if (lo, tensor_info(r.type).dtype, tensor_info(r.type).shape) != (
                slot.address,
                slot.dtype,
                slot.shape,
            ):
                problems.append(f"weight {names[r]} at {lo} is not its planned slot {slot}")
            region = plan.regions["weight"]
        elif kind[r] == "io":
            io_name = names[r].split(" ", 1)[1]
            if io_name.startswith("history_"):
                region = plan.regions["kv"]
                slot = plan.kv[f"layers.{layer}.{io_name[-1]}"]
            else:
                region = plan.regions["io"]
                if io_name == "hidden_states" and layer >= 0:  # blocks ping-pong between two buffers
                    slot = plan.hidden_binding(layer, names[r].startswith("output"))
                else:
                    slot = plan.binding(net, layer, io_name)
            if lo != slot.address or hi > slot.address + slot.nbytes:
                problems.append(f"{names[r]} at [{lo}, {hi}) is not inside its buffer {slot}")
        else:
            region = (act_lo, act_hi - act_lo)
        if not (region[0] <= lo and hi <= region[0] + region[1]):
            problems.append(f"{names[r]} at [{lo}, {hi}) is outside its region [{region[0]}, {region[0] + region[1]})")

    roots = list(born)
    for i, a in enumerate(roots):
        for b in roots[i + 1 :]:
            live_together = born[a] <= last[b] and born[b] <= last[a]
            share_bytes = address(a) < address(b) + size[b] and address(b) < address(a) + size[a]
            if live_together and share_bytes:
                problems.append(f"{names[a]} and {names[b]} are live together and share bytes")
    return problems


def _nbytes(v: SSAValue) -> int:
    info = tensor_info(v.type)
    return itemsize(info.dtype) * int(np.prod(info.shape, dtype=np.int64))


# ---- properties over every net and mode ---------------------------------------------------------

SPECS = {
    "qwen2": ModelSpec("qwen2", 64, 2, 4, 2, 16, 128, 512, 1e-6, 10000.0, True, True, False, 256),
    "llama": ModelSpec("llama", 48, 2, 3, 1, 16, 96, 300, 1e-5, 500000.0, False, False, False, 256),
    "qwen3": ModelSpec("qwen3", 64, 2, 4, 2, 32, 128, 512, 1e-6, 1000000.0, True, False, True, 256),
}
SHAPES = Shapes(seq_length=16, prefill_length=4)
NETS = [
    *(f"{stage}@{layer}" for stage in STAGES for layer in (0, 1)),
    "embedding",
    "embedding_cache",
    "lm_head",
]


def top_net(arch: str, net: str) -> ModuleOp:
    if "@" in net:
        stage, layer = net.split("@")
        return build_block(SPECS[arch], int(layer), stage, SHAPES)
    return head_nets(SPECS[arch], SHAPES)[net]


_PLANS: dict[tuple[str, str], MemoryPlan] = {}


def plan_for(arch: str, mode: str) -> MemoryPlan:
    if (arch, mode) not in _PLANS:
        _PLANS[arch, mode] = make_plan(SPECS[arch], SHAPES, mode, 4096)
    return _PLANS[arch, mode]


def compiled(arch: str, net: str, mode: str) -> tuple[ModuleOp, ModuleOp]:
    """(canonical top module, address-assigned tpu module), as `compile_net` makes them."""
    top = top_net(arch, net)
    run_passes(top, [Canonicalize()])
    tpu = top.clone()
    run_passes(tpu, [LowerTopToTpu(mode=mode)])
    assign_addresses(tpu, plan_for(arch, mode))
    tpu.verify()
    return top, tpu


@pytest.mark.parametrize("mode", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("arch", SPECS)
def test_assigned_addresses_never_overlap_live_buffers(arch: str, mode: str) -> None:
    for net in NETS:
        _, tpu = compiled(arch, net, mode)
        assert address_violations(tpu, plan_for(arch, mode)) == [], net
        # the activation region really is reused: a block's peak is below the sum of its activations
        acts = [op.results[0] for op in ops_of(tpu) if op.name.startswith("tpu.") and op.name != "tpu.Reshape"]
        total = sum(align(_nbytes(v), ACTIVATION_ALIGN) for v in acts)
        peak = tpu.attributes["tpu.activation_bytes"].value.data
        assert peak < total if "@" in net else peak <= total, net


def _retarget(value: SSAValue, addr: int) -> None:
    t = value.type
    assert isinstance(t, TensorType)
    Rewriter.replace_value_with_new_type(value, TensorType(t.element_type, t.get_shape(), IntegerAttr(addr, i64)))


def test_address_checker_detects_injected_faults() -> None:
    # The checker above would make the property test vacuous if it found nothing wrong, ever.
    plan = plan_for("qwen2", "bf16")
    _, tpu = compiled("qwen2", "prefill@0", "bf16")
    assert address_violations(tpu, plan) == []
    ops = by_loc(tpu)
    _retarget(ops["layers.0.up_proj"].results[0], address(ops["layers.0.gate_proj"].results[0]))
    assert any("live together" in p for p in address_violations(tpu, plan))

    _, tpu = compiled("qwen2", "prefill@0", "bf16")
    ops = by_loc(tpu)
    _retarget(ops["layers.0.q_heads"].results[0], address(ops["layers.0.q_heads"].results[0]) + 64)
    assert any("view at" in p for p in address_violations(tpu, plan))

    _, tpu = compiled("qwen2", "prefill@0", "bf16")
    _retarget(by_loc(tpu)["layers.0.down_proj"].results[0], plan.activation_base + (1 << 20))
    assert any("outside its region" in p for p in address_violations(tpu, plan))


# ---- the lowering preserves the semantics ---------------------------------------------------------


def random_weights(module: ModuleOp, spec: ModelSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    cos, sin = rope_tables(spec, SHAPES.seq_length)
    weights = {ROPE_COS: cos, ROPE_SIN: sin}
    for op in ops_of(module):
        if op.name == "top.Weight" and op.attributes["name"].data not in weights:
            shape = tensor_info(op.results[0].type).shape
            w = rng.standard_normal(shape) / np.sqrt(shape[-1])
            if "norm" in op.attributes["name"].data:
                w = 1.0 + 0.1 * w  # norm gains sit around 1 in real checkpoints
            weights[op.attributes["name"].data] = w.astype(np.float32)
    return weights


def random_inputs(module: ModuleOp, spec: ModelSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    # prefill with one padding row, to check padding stays out of the real rows
    return random_net_inputs(module, spec.vocab_size, SHAPES.prefill_length, SHAPES.seq_length, 5, rng,
                             prefill_rows=SHAPES.prefill_length - 1)


def nets_with_data(seed: int) -> Iterator[tuple[str, str, ModuleOp, ModuleOp, dict, dict]]:
    rng = np.random.default_rng(seed)
    for arch in SPECS:
        for net in NETS:
            if net.endswith("@1"):
                continue  # layer 1 computes like layer 0; its addresses are covered above
            top, tpu = compiled(arch, net, "f32")
            yield (
                arch,
                net,
                top,
                tpu,
                random_weights(top, SPECS[arch], rng),
                random_inputs(top, SPECS[arch], rng),
            )


def test_f32_tpu_interpretation_equals_top_reference() -> None:
    for arch, net, top, tpu, weights, inputs in nets_with_data(seed=1):
        want = interpret(top, inputs, weights.__getitem__, reference=True)
        got = interpret(tpu, inputs, weights.__getitem__, reference=False)
        assert set(got.outputs) == set(want.outputs)
        for name, ref in want.outputs.items():
            out = got.outputs[name]
            assert out.dtype == np.float32 and out.shape == ref.shape
            err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
            assert err < 1e-5, f"{arch} {net} {name}: relative error {err:.2e}"
            # and element by element, relative to the output's scale (a norm can hide one bad row)
            np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max(), err_msg=f"{net} {name}")
            assert np.abs(ref).max() > 0.1  # not a trivially small output
        # every op kept its loc, so per-op comparison (as the build's checks do) stays possible
        assert got.order == want.order


def test_bf16_tpu_interpretation_is_close_but_not_equal_to_f32() -> None:
    # The control for the test above: a bf16 lowering really rounds (so "equal" above is not vacuous),
    # yet stays close to the reference.
    rng = np.random.default_rng(2)
    top = top_net("qwen2", "prefill@0")
    run_passes(top, [Canonicalize()])
    tpu = top.clone()
    run_passes(tpu, [LowerTopToTpu(mode="bf16")])
    weights, inputs = random_weights(top, SPECS["qwen2"], rng), random_inputs(top, SPECS["qwen2"], rng)
    ref = interpret(top, inputs, weights.__getitem__, reference=True).outputs["hidden_states"]
    got = interpret(tpu, inputs, weights.__getitem__, reference=False).outputs["hidden_states"]
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert 1e-4 < err < 3e-2

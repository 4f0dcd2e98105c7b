"""The `top`/`tpu` dialects: op verifiers, the textual round trip, upstream MLIR compatibility and the
static signatures of the stage nets."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable
from types import ModuleType

import pytest
from xdsl.dialects.builtin import ModuleOp, TensorType, bf16, f32, i32
from xdsl.ir import Attribute, Block, Operation, SSAValue
from xdsl.utils.exceptions import VerifyException

from llmbuild import LlmbuildError
from llmbuild.codegen.memory_plan import make_plan
from llmbuild.dialects import common, module_text, parse_module_text, top, tpu
from llmbuild.dialects.plain import main_func, string_list, tensor_info
from llmbuild.families.spec import ModelSpec
from llmbuild.importer.nets import STAGES, Shapes, block_net_name, build_block, head_nets
from llmbuild.passes import run_passes
from llmbuild.passes.assign_address import assign_addresses
from llmbuild.passes.canonicalize import Canonicalize
from llmbuild.passes.lower_top_to_tpu import LowerTopToTpu

# ---- op verifiers ---------------------------------------------------------------------------------


def t(*shape: int, element: Attribute = f32) -> TensorType:
    return TensorType(element, list(shape))


def values(*types: TensorType) -> list[SSAValue]:
    """Fresh SSA values of the given types (block arguments: ops need operands, not a whole net)."""
    return list(Block(arg_types=list(types)).args)


def matmul(
    d: ModuleType,
    x: TensorType,
    w: TensorType,
    out: TensorType,
    *,
    transpose: bool = True,
    bias: TensorType | None = None,
) -> Operation:
    ops = values(x, w, *([bias] if bias else []))
    return d.MatMulOp.build(
        operands=[ops[0], ops[1], ops[2:]],
        result_types=[out],
        attributes={"right_transpose": common.bool_attr(transpose), "do_relu": common.bool_attr(False)},
    )


def gather(d: ModuleType, table: TensorType, idx: TensorType, out: TensorType, axis: int = 0) -> Operation:
    a, b = values(table, idx)
    return d.GatherOp.build(operands=[a, b], result_types=[out], attributes={"axis": common.i64_attr(axis)})


def rms_norm(d: ModuleType, x: TensorType, gamma: TensorType, out: TensorType) -> Operation:
    a, b = values(x, gamma)
    return d.RMSNormOp.build(operands=[a, b], result_types=[out], attributes={"eps": common.f64_attr(1e-6)})


def rope(d: ModuleType, x: TensorType, cos: TensorType, sin: TensorType, out: TensorType) -> Operation:
    return d.RopeOp.build(operands=values(x, cos, sin), result_types=[out])


def attention(
    d: ModuleType,
    q: TensorType,
    k: TensorType,
    v: TensorType,
    mask: TensorType,
    out: TensorType,
    **overrides: int,
) -> Operation:
    b, mq, qh, dim = q.get_shape()
    _, mk, kvh, _ = k.get_shape()
    ints = {"batch": b, "q_head": qh, "kv_head": kvh, "dim": dim, "mq": mq, "mk": mk} | overrides
    attrs = {k_: common.i64_attr(v_) for k_, v_ in ints.items()} | {"scale": common.f64_attr(0.25)}
    return d.FAttentionOp.build(operands=values(q, k, v, mask), result_types=[out], attributes=attrs)


def concat(d: ModuleType, inputs: list[TensorType], out: TensorType, axis: int) -> Operation:
    return d.ConcatOp.build(operands=[values(*inputs)], result_types=[out], attributes={"axis": common.i64_attr(axis)})


def permute(d: ModuleType, x: TensorType, order: list[int], out: TensorType) -> Operation:
    return d.PermuteOp.build(operands=values(x), result_types=[out], attributes={"order": common.i64_array(order)})


def unary(cls: type[Operation], x: TensorType, out: TensorType, **attrs: Attribute) -> Operation:
    return cls.build(operands=values(x), result_types=[out], attributes=attrs)


# (id, builder of a well-formed op, builder of a malformed one, part of the expected message).
# Every malformed op differs from its well-formed twin in one respect, so a verifier that accepts it
# has missed exactly that check.
OpCase = tuple[str, Callable[[ModuleType], Operation], Callable[[ModuleType], Operation], str]
SHARED_CASES: list[OpCase] = [
    (
        "matmul-K",
        lambda d: matmul(d, t(1, 4, 8), t(16, 8), t(1, 4, 16)),
        lambda d: matmul(d, t(1, 4, 8), t(16, 9), t(1, 4, 16)),
        "does not match right",
    ),
    (
        "matmul-K-no-transpose",
        lambda d: matmul(d, t(1, 4, 8), t(8, 16), t(1, 4, 16), transpose=False),
        lambda d: matmul(d, t(1, 4, 8), t(16, 8), t(1, 4, 8), transpose=False),
        "does not match right",
    ),
    (
        "matmul-rank3-right",
        lambda d: matmul(d, t(1, 4, 8), t(16, 8), t(1, 4, 16)),
        lambda d: matmul(d, t(1, 4, 8), t(16, 8, 1), t(1, 4, 16)),
        "does not match right",
    ),
    (
        "matmul-output",
        lambda d: matmul(d, t(1, 4, 8), t(16, 8), t(1, 4, 16)),
        lambda d: matmul(d, t(1, 4, 8), t(16, 8), t(1, 4, 8)),
        "output must be",
    ),
    (
        "matmul-bias",
        lambda d: matmul(d, t(1, 4, 8), t(16, 8), t(1, 4, 16), bias=t(16)),
        lambda d: matmul(d, t(1, 4, 8), t(16, 8), t(1, 4, 16), bias=t(8)),
        "bias must be",
    ),
    (
        "gather-output",
        lambda d: gather(d, t(32, 8), t(1, 4, element=i32), t(1, 4, 8)),
        lambda d: gather(d, t(32, 8), t(1, 4, element=i32), t(4, 8)),
        "output shape should be",
    ),
    (
        "gather-axis1",
        lambda d: gather(d, t(32, 8), t(1, 4, element=i32), t(32, 1, 4), axis=1),
        lambda d: gather(d, t(32, 8), t(1, 4, element=i32), t(1, 4, 8), axis=1),
        "output shape should be",
    ),
    (
        "rmsnorm-gamma",
        lambda d: rms_norm(d, t(1, 4, 8), t(8), t(1, 4, 8)),
        lambda d: rms_norm(d, t(1, 4, 8), t(4), t(1, 4, 8)),
        "gamma must match",
    ),
    (
        "rmsnorm-gamma-rank",
        lambda d: rms_norm(d, t(1, 4, 8), t(8), t(1, 4, 8)),
        lambda d: rms_norm(d, t(1, 4, 8), t(1, 8), t(1, 4, 8)),
        "gamma must match",
    ),
    (
        "rmsnorm-output",
        lambda d: rms_norm(d, t(1, 4, 8), t(8), t(1, 4, 8)),
        lambda d: rms_norm(d, t(1, 4, 8), t(8), t(1, 8, 4)),
        "output shape must equal input",
    ),
    (
        "reshape-numel",
        lambda d: unary(d.ReshapeOp, t(1, 4, 8), t(1, 4, 2, 4)),
        lambda d: unary(d.ReshapeOp, t(1, 4, 8), t(1, 4, 3, 4)),
        "cannot reshape",
    ),
    (
        "permute-not-a-permutation",
        lambda d: permute(d, t(1, 4, 8), [0, 2, 1], t(1, 8, 4)),
        lambda d: permute(d, t(1, 4, 8), [0, 1, 1], t(1, 4, 4)),
        "not a permutation",
    ),
    (
        "permute-output",
        lambda d: permute(d, t(1, 4, 8), [0, 2, 1], t(1, 8, 4)),
        lambda d: permute(d, t(1, 4, 8), [0, 2, 1], t(1, 4, 8)),
        "output shape mismatch",
    ),
    (
        "rope-cos-shape",
        lambda d: rope(d, t(1, 4, 2, 8), t(1, 4, 1, 8), t(1, 4, 1, 8), t(1, 4, 2, 8)),
        lambda d: rope(d, t(1, 4, 2, 8), t(1, 4, 2, 8), t(1, 4, 1, 8), t(1, 4, 2, 8)),
        "cos/sin must be",
    ),
    (
        "rope-sin-shape",
        lambda d: rope(d, t(1, 4, 2, 8), t(1, 4, 1, 8), t(1, 4, 1, 8), t(1, 4, 2, 8)),
        lambda d: rope(d, t(1, 4, 2, 8), t(1, 4, 1, 8), t(1, 3, 1, 8), t(1, 4, 2, 8)),
        "cos/sin must be",
    ),
    (
        "rope-odd-dim",
        lambda d: rope(d, t(1, 4, 2, 8), t(1, 4, 1, 8), t(1, 4, 1, 8), t(1, 4, 2, 8)),
        lambda d: rope(d, t(1, 4, 2, 7), t(1, 4, 1, 7), t(1, 4, 1, 7), t(1, 4, 2, 7)),
        "must be even",
    ),
    (
        "rope-output",
        lambda d: rope(d, t(1, 4, 2, 8), t(1, 4, 1, 8), t(1, 4, 1, 8), t(1, 4, 2, 8)),
        lambda d: rope(d, t(1, 4, 2, 8), t(1, 4, 1, 8), t(1, 4, 1, 8), t(1, 4, 16)),
        "output shape must equal",
    ),
    (
        "fattention-heads-divide",
        lambda d: attention(d, t(1, 4, 6, 8), t(1, 4, 3, 8), t(1, 4, 3, 8), t(1, 1, 4, 4), t(1, 4, 48)),
        lambda d: attention(d, t(1, 4, 6, 8), t(1, 4, 4, 8), t(1, 4, 4, 8), t(1, 1, 4, 4), t(1, 4, 48)),
        "must be a multiple of kv_head",
    ),
    (
        "fattention-queries",
        lambda d: attention(d, t(1, 4, 4, 8), t(1, 6, 2, 8), t(1, 6, 2, 8), t(1, 1, 4, 6), t(1, 4, 32)),
        lambda d: attention(d, t(1, 4, 4, 8), t(1, 6, 2, 8), t(1, 6, 2, 8), t(1, 1, 4, 6), t(1, 4, 32), dim=4),
        "queries shape mismatch",
    ),
    (
        "fattention-values",
        lambda d: attention(d, t(1, 4, 4, 8), t(1, 6, 2, 8), t(1, 6, 2, 8), t(1, 1, 4, 6), t(1, 4, 32)),
        lambda d: attention(d, t(1, 4, 4, 8), t(1, 6, 2, 8), t(1, 5, 2, 8), t(1, 1, 4, 6), t(1, 4, 32)),
        "values shape mismatch",
    ),
    (
        "fattention-keys",
        lambda d: attention(d, t(1, 4, 4, 8), t(1, 6, 2, 8), t(1, 6, 2, 8), t(1, 1, 4, 6), t(1, 4, 32)),
        lambda d: attention(d, t(1, 4, 4, 8), t(1, 6, 2, 8), t(1, 6, 2, 8), t(1, 1, 4, 6), t(1, 4, 32), mk=5),
        "keys shape mismatch",
    ),
    (
        "fattention-mask",
        lambda d: attention(d, t(1, 4, 4, 8), t(1, 6, 2, 8), t(1, 6, 2, 8), t(1, 1, 4, 6), t(1, 4, 32)),
        lambda d: attention(d, t(1, 4, 4, 8), t(1, 6, 2, 8), t(1, 6, 2, 8), t(1, 1, 4, 4), t(1, 4, 32)),
        "mask shape mismatch",
    ),
    (
        "fattention-output",
        lambda d: attention(d, t(1, 4, 4, 8), t(1, 6, 2, 8), t(1, 6, 2, 8), t(1, 1, 4, 6), t(1, 4, 32)),
        lambda d: attention(d, t(1, 4, 4, 8), t(1, 6, 2, 8), t(1, 6, 2, 8), t(1, 1, 4, 6), t(1, 4, 4, 8)),
        "output shape mismatch",
    ),
    (
        "concat-mismatch",
        lambda d: concat(d, [t(1, 6, 2, 8), t(1, 2, 2, 8)], t(1, 8, 2, 8), axis=1),
        lambda d: concat(d, [t(1, 6, 2, 8), t(1, 2, 1, 8)], t(1, 8, 2, 8), axis=1),
        "inputs differ outside axis",
    ),
    (
        "concat-output",
        lambda d: concat(d, [t(1, 6, 2, 8), t(1, 2, 2, 8)], t(1, 8, 2, 8), axis=1),
        lambda d: concat(d, [t(1, 6, 2, 8), t(1, 2, 2, 8)], t(1, 6, 2, 8), axis=1),
        "output should be",
    ),
    (
        "add-arity",
        lambda d: d.AddOp.build(operands=[values(t(4), t(4))], result_types=[t(4)]),
        lambda d: d.AddOp.build(operands=[values(t(4))], result_types=[t(4)]),
        "at least two inputs",
    ),
    (
        "mul-arity",
        lambda d: d.MulOp.build(operands=[values(t(4), t(4))], result_types=[t(4)]),
        lambda d: d.MulOp.build(operands=[values(t(4))], result_types=[t(4)]),
        "at least two inputs",
    ),
    (
        "softmax-output",
        lambda d: unary(d.SoftmaxOp, t(2, 4), t(2, 4), axis=common.i64_attr(-1)),
        lambda d: unary(d.SoftmaxOp, t(2, 4), t(4, 2), axis=common.i64_attr(-1)),
        "output shape must equal",
    ),
]

TOP_ONLY: list[OpCase] = [
    (
        "input-shape",
        lambda d: unary(top.InputOp, t(1, 4), t(1, 4)),
        lambda d: unary(top.InputOp, t(1, 4), t(4, 1)),
        "input and output shapes differ",
    ),
    (
        "silu-output",
        lambda d: unary(top.SiLUOp, t(1, 4), t(1, 4)),
        lambda d: unary(top.SiLUOp, t(1, 4), t(1, 5)),
        "output shape must equal",
    ),
]
TPU_ONLY: list[OpCase] = [
    (
        "active-output",
        lambda d: unary(tpu.ActiveOp, t(1, 4, element=bf16), t(1, 4, element=bf16), mode=common.StringAttr("SILU")),
        lambda d: unary(tpu.ActiveOp, t(1, 4, element=bf16), t(2, 4, element=bf16), mode=common.StringAttr("SILU")),
        "output shape must equal",
    ),
    (
        "cast-output",
        lambda d: unary(tpu.CastOp, t(1, 4), t(1, 4, element=bf16)),
        lambda d: unary(tpu.CastOp, t(1, 4), t(1, 2, element=bf16)),
        "output shape must equal",
    ),
]

VERIFIER_CASES = [pytest.param(top, *c[1:], id=f"top-{c[0]}") for c in SHARED_CASES + TOP_ONLY] + [
    pytest.param(tpu, *c[1:], id=f"tpu-{c[0]}") for c in SHARED_CASES + TPU_ONLY
]


@pytest.mark.parametrize("dialect,good,bad,message", VERIFIER_CASES)
def test_verifier_rejects_malformed_op(dialect: ModuleType, good: Callable, bad: Callable, message: str) -> None:
    good(dialect).verify()  # the control: only the one malformed respect makes `bad` fail
    op = bad(dialect)
    with pytest.raises(VerifyException, match=message) as info:
        op.verify()
    assert op.name in str(info.value)  # the message names the op kind


# Malformed ops whose verifiers once crashed: a Python exception escaped `verify()`
# (and so `run_passes`) instead of a VerifyException: each must now be reported as one.
CRASHING_CASES = [
    pytest.param(lambda: matmul(top, t(1, 4, 8), t(8), t(1, 4, 8)), id="matmul-rank1-right"),
    pytest.param(lambda: rope(top, t(1, 4, 8), t(1, 4, 1, 8), t(1, 4, 1, 8), t(1, 4, 8)), id="rope-rank3-input"),
    pytest.param(
        lambda: attention(top, t(1, 4, 2, 8), t(1, 4, 2, 8), t(1, 4, 2, 8), t(1, 1, 4, 4), t(1, 4, 16), kv_head=0),
        id="fattention-kv-head-0",
    ),
    pytest.param(lambda: concat(top, [t(1, 4), t(1, 4)], t(1, 8), axis=2), id="concat-axis-out-of-range"),
]


@pytest.mark.parametrize("build", CRASHING_CASES)
def test_verifier_reports_bad_rank_as_verify_exception(build: Callable[[], Operation]) -> None:
    with pytest.raises(VerifyException):
        build().verify()


@pytest.mark.parametrize(
    "build",
    [
        # axis 5 of a rank-2 table: the verifier's slicing makes up a "valid" output shape.
        pytest.param(lambda: gather(top, t(32, 8), t(1, 4, element=i32), t(32, 8, 1, 4), axis=5), id="gather-axis"),
        pytest.param(
            lambda: top.AddOp.build(operands=[values(t(1, 4, 8), t(1, 4, 16))], result_types=[t(1, 4, 8)]),
            id="add-incompatible",
        ),
    ],
)
def test_verifier_rejects_unchecked_shapes(build: Callable[[], Operation]) -> None:
    with pytest.raises(VerifyException):
        build().verify()


# ---- the nets -------------------------------------------------------------------------------------

SPECS = {
    # qwen2-like: q/k/v bias, tied embeddings, GQA
    "qwen2": ModelSpec("qwen2", 64, 2, 4, 2, 16, 128, 512, 1e-6, 10000.0, True, True, False, 256),
    # llama-like: no bias, untied lm_head, more query heads per KV head
    "llama": ModelSpec("llama", 48, 2, 3, 1, 16, 96, 300, 1e-5, 500000.0, False, False, False, 256),
    # qwen3-like: q/k RMSNorm and head_dim * heads != hidden
    "qwen3": ModelSpec("qwen3", 64, 2, 4, 2, 32, 128, 512, 1e-6, 1000000.0, True, False, True, 256),
}
SHAPES = Shapes(seq_length=16, prefill_length=4)
HEAD_NETS = ("embedding", "embedding_cache", "lm_head")


NETS = [*STAGES, *HEAD_NETS]
ALL_NETS = [pytest.param(a, n, id=f"{a}-{n}") for a in SPECS for n in NETS]


def build_net(arch: str, net: str, layer: int = 0) -> ModuleOp:
    spec = SPECS[arch]
    if net in HEAD_NETS:
        return head_nets(spec, SHAPES)[net]
    return build_block(spec, layer, net, SHAPES)


@functools.cache
def net_texts(arch: str, net: str) -> tuple[str, str]:
    """(top text, tpu text after canonicalize + bf16 lowering + addresses) of one net, built once."""
    top_text = module_text(build_net(arch, net))
    module = build_net(arch, net)
    run_passes(module, [Canonicalize(), LowerTopToTpu(mode="bf16")])
    assign_addresses(module, make_plan(SPECS[arch], SHAPES, "bf16", 4096))
    return top_text, module_text(module)


@pytest.mark.parametrize("arch,net", ALL_NETS)
def test_text_round_trip_top_and_tpu(arch: str, net: str) -> None:
    for text in net_texts(arch, net):
        again = module_text(parse_module_text(text, "net.mlir"))
        assert again == text
        # a round trip of a printer that printed nothing would also be "identical"
        assert text.count('"top.') + text.count('"tpu.') > 2
    assert "tpu.activation_bytes" in net_texts(arch, net)[1]


def test_text_round_trip_of_layer_one() -> None:
    # Layer 1's weight names and net name differ from layer 0's.
    text = module_text(build_net("qwen2", "decode", layer=1))
    assert '"layers.1.self_attn.q_proj.weight"' in text
    assert module_text(parse_module_text(text)) == text


@pytest.mark.parametrize(
    "text",
    [
        "garbage",
        "",
        '"builtin.module"() ({\n}) : () -> ()\n',
        "func.func @f() {\n",
        '"top.Nope"() : () -> ()',
    ],
)
def test_parse_garbage_is_one_line_error(text: str) -> None:
    with pytest.raises(LlmbuildError) as info:
        parse_module_text(text, "broken.mlir")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("broken.mlir: ")


def test_parse_error_of_a_verifier_keeps_the_reason() -> None:
    # A well-formed text whose op is malformed: the verifier's reason must reach the one line.
    text = net_texts("qwen2", "lm_head")[0].replace("tensor<1x512xf32>", "tensor<1x511xf32>")
    with pytest.raises(LlmbuildError, match="top.MatMul: output must be") as info:
        parse_module_text(text, "bad.mlir")
    assert "\n" not in str(info.value)


def test_parse_error_names_the_reason() -> None:
    with pytest.raises(LlmbuildError, match="not registered"):
        parse_module_text('"top.Nope"() : () -> ()', "bad.mlir")


# ---- upstream MLIR --------------------------------------------------------------------------------

SPLIT = "// -----\n"


@pytest.fixture(scope="module")
def mlir_opt() -> str:
    path = shutil.which("mlir-opt-22") or ("/usr/bin/mlir-opt-22" if os.path.exists("/usr/bin/mlir-opt-22") else None)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("mlir-opt-22 is required in CI (upstream-MLIR compatibility of every emitted file)")
        pytest.skip("mlir-opt-22 is not installed")
    return path


def op_count(text: str) -> int:
    return text.count('"top.') + text.count('"tpu.')


@pytest.mark.parametrize("arch", SPECS)
def test_upstream_mlir_parses_top_and_tpu(mlir_opt: str, arch: str) -> None:
    # One mlir-opt run per architecture (--split-input-file): a process per module costs seconds.
    texts = [text for net in NETS for text in net_texts(arch, net)]
    run = subprocess.run(
        [mlir_opt, "--allow-unregistered-dialect", "--split-input-file", "--mlir-print-op-generic"],
        input=SPLIT.join(texts),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    printed = run.stdout.split("// -----")
    assert len(printed) == len(texts)
    # mlir-opt kept every op of every module (unregistered ops are opaque to it, not dropped)
    assert [op_count(p) for p in printed] == [op_count(t) for t in texts]


def test_upstream_mlir_rejects_broken_text(mlir_opt: str) -> None:
    # The control: the check above would pass vacuously if mlir-opt accepted anything.
    text = net_texts("qwen2", "lm_head")[1].replace("->", "=>", 1)
    run = subprocess.run([mlir_opt, "--allow-unregistered-dialect"], input=text, capture_output=True, text=True)
    assert run.returncode != 0


# ---- stage signatures -----------------------------------------------------------------------------


def signature(
    module: ModuleOp,
) -> tuple[list[tuple[str, tuple[int, ...], str]], list[tuple[str, tuple[int, ...], str]]]:
    fn = main_func(module)
    ret = fn.body.block.last_op
    assert ret is not None
    args = [
        (n, tensor_info(a.type).shape, tensor_info(a.type).dtype)
        for n, a in zip(string_list(fn.attributes["arg_names"]), fn.body.block.args, strict=True)
    ]
    results = [
        (n, tensor_info(v.type).shape, tensor_info(v.type).dtype)
        for n, v in zip(string_list(fn.attributes["result_names"]), ret.operands, strict=True)
    ]
    # the declared function type must agree with the block and the return
    assert list(fn.function_type.inputs.data) == [a.type for a in fn.body.block.args]
    assert list(fn.function_type.outputs.data) == [v.type for v in ret.operands]
    return args, results


@pytest.mark.parametrize("arch", SPECS)
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("layer", [0, 1])
def test_block_stage_signature(arch: str, stage: str, layer: int) -> None:
    spec = SPECS[arch]
    L, S, H = SHAPES.prefill_length, SHAPES.seq_length, spec.hidden_size
    kvd = (spec.num_kv_heads, spec.head_dim)
    n = 1 if stage == "decode" else L
    keys = {"prefill": L, "prefill_kv": S + L, "decode": S + 1}[stage]
    want_args = [
        ("hidden_states", (1, n, H), "f32"),
        ("position_ids", (1, n), "i32"),
        ("attention_mask", (1, 1, n, keys), "f32"),
    ]
    if stage != "prefill":
        want_args += [("history_k", (1, S, *kvd), "f32"), ("history_v", (1, S, *kvd), "f32")]
    want_results = [
        ("hidden_states", (1, n, H), "f32"),
        ("present_k", (1, n, *kvd), "f32"),
        ("present_v", (1, n, *kvd), "f32"),
    ]
    module = build_block(spec, layer, stage, SHAPES)
    assert signature(module) == (want_args, want_results)
    net = block_net_name(layer, stage)
    assert main_func(module).sym_name.data == net
    assert module.attributes["top.net"].data == net
    assert module.attributes["top.stage"].data == stage
    assert module.attributes["top.layer"].value.data == layer


@pytest.mark.parametrize("arch", SPECS)
def test_head_net_signatures(arch: str) -> None:
    spec = SPECS[arch]
    L, H, V = SHAPES.prefill_length, spec.hidden_size, spec.vocab_size
    nets = head_nets(spec, SHAPES)
    assert signature(nets["embedding"]) == (
        [("input_ids", (1, L), "i32")],
        [("hidden_states", (1, L, H), "f32")],
    )
    assert signature(nets["embedding_cache"]) == (
        [("input_ids", (1, 1), "i32")],
        [("hidden_states", (1, 1, H), "f32")],
    )
    assert signature(nets["lm_head"]) == ([("hidden_states", (1, H), "f32")], [("logits", (1, V), "f32")])
    for name, module in nets.items():
        assert module.attributes["top.net"].data == name
        assert module.attributes["top.layer"].value.data == -1


@pytest.mark.parametrize("mode,float_type", [("bf16", "bf16"), ("f16", "f16"), ("f32", "f32")])
def test_lowered_signature_types(mode: str, float_type: str) -> None:
    # After lowering, float IO takes the mode's type, ids stay i32 and logits stay f32.
    block = build_block(SPECS["qwen2"], 0, "prefill_kv", SHAPES)
    run_passes(block, [LowerTopToTpu(mode=mode)])
    args, results = signature(block)
    assert [a[2] for a in args] == [float_type, "i32", float_type, float_type, float_type]
    assert [r[2] for r in results] == [float_type] * 3
    lm = head_nets(SPECS["qwen2"], SHAPES)["lm_head"]
    run_passes(lm, [LowerTopToTpu(mode=mode)])
    assert signature(lm) == ([("hidden_states", (1, 64), float_type)], [("logits", (1, 512), "f32")])

"""Every op's host kernel (numerics/kernels.py, what the executors run) against its plain spec kernel
(llmbuild/op_defs/), on random inputs in each compute dtype: equal where the arithmetic is defined the
same way, within a stated rounding bound where the host sums in another order (tiled products, attention
in key blocks). An op or top op without a spec kernel, or without a case here, fails."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from llmbuild.numerics.kernels import KERNELS
from llmbuild.op_defs import OPS, SPEC_KERNELS

DTYPES = (np.float32, np.float64)
Case = tuple[dict[str, Any], tuple[np.ndarray, ...]]


def _randn(rng: np.random.Generator, dtype: type, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def _matmul(rng, dtype) -> Iterator[Case]:
    for m, tiles in ((1, {}), (5, {}), (40, {}), (40, {"tile_m": 16}), (40, {"tile_m": 16, "tile_n": 24})):
        x, w, b = _randn(rng, dtype, 1, m, 48), _randn(rng, dtype, 56, 48), _randn(rng, dtype, 56)
        yield {"right_transpose": True, "do_relu": False, **tiles}, (x, w)
        yield {"right_transpose": True, "do_relu": True, **tiles}, (x, w, b)
    yield {"right_transpose": False, "do_relu": False}, (_randn(rng, dtype, 1, 7, 48), _randn(rng, dtype, 48, 24))


def _quantized(rng, bits: int, packed: bool, n: int, k: int, g: int) -> tuple[np.ndarray, ...]:
    levels = rng.integers(0, 1 << bits, (n, k), dtype=np.uint8)
    weight = (levels[:, 0::2] | (levels[:, 1::2] << 4)).astype(np.uint8) if packed else levels
    scale = (rng.random((n, k // g)) * 0.02 + 0.001).astype(np.float32)
    zp = rng.integers(0, 1 << bits, (n, k // g), dtype=np.uint8)
    return weight, scale, zp


def _a16_attrs() -> Iterator[tuple[dict[str, Any], int, bool]]:
    for bits, packed in ((4, True), (4, False), (8, False)):
        for dequant in (None, "bf16", "f16"):
            attrs = {"weight_bits": bits, "q_group_size": 16, "packed": packed}
            yield (attrs if dequant is None else {**attrs, "dequant_dtype": dequant}), bits, packed


def _a16_matmul(rng, dtype) -> Iterator[Case]:
    for attrs, bits, packed in _a16_attrs():
        for m in (1, 40):
            x = _randn(rng, dtype, 1, m, 64)
            yield {**attrs, "tile_n": 24}, (x, *_quantized(rng, bits, packed, 48, 64, 16))
            yield attrs, (x, *_quantized(rng, bits, packed, 48, 64, 16), _randn(rng, dtype, 48))


def _a16_gather(rng, dtype) -> Iterator[Case]:
    for attrs, bits, packed in _a16_attrs():
        yield attrs, (*_quantized(rng, bits, packed, 30, 64, 16), rng.integers(0, 30, (1, 9)).astype(np.int32))


def _gather(rng, dtype) -> Iterator[Case]:
    yield {"axis": 0}, (_randn(rng, dtype, 30, 16), rng.integers(0, 30, (1, 9)).astype(np.int32))
    yield {"axis": 2}, (_randn(rng, dtype, 1, 5, 16), rng.permutation(16).astype(np.int32))


def _fattention(rng, dtype) -> Iterator[Case]:
    for qh, kvh, mq, mk, tiles in ((4, 2, 6, 6, {}), (4, 4, 1, 40, {}), (8, 2, 24, 64, {"tile_k": 16}),
                                   (4, 2, 24, 64, {"tile_k": 32, "tile_q": 8, "tile_kvh": 1})):
        d = 8
        mask = np.where(np.tril(np.ones((mq, mk)), mk - mq) > 0, 0.0, -9984.0).astype(dtype)[None, None]
        yield ({"scale": d ** -0.5, "batch": 1, "q_head": qh, "kv_head": kvh, "dim": d, "mq": mq, "mk": mk, **tiles},
               (_randn(rng, dtype, 1, mq, qh, d), _randn(rng, dtype, 1, mk, kvh, d), _randn(rng, dtype, 1, mk, kvh, d),
                mask))


def _unary(attrs: dict[str, Any], *shape: int) -> Callable:
    def cases(rng, dtype) -> Iterator[Case]:
        yield attrs, (_randn(rng, dtype, *shape) * 3,)
    return cases


def _norm(n_params: int) -> Callable:
    def cases(rng, dtype) -> Iterator[Case]:
        yield {"eps": 1e-6}, (_randn(rng, dtype, 1, 5, 32), *(_randn(rng, dtype, 32) for _ in range(n_params)))
    return cases


def _binary(rng, dtype) -> Iterator[Case]:
    yield {}, (_randn(rng, dtype, 1, 5, 32), _randn(rng, dtype, 1, 5, 32))
    yield {}, (_randn(rng, dtype, 1, 1, 5, 8), _randn(rng, dtype, 1, 4, 1, 8), _randn(rng, dtype, 8))


def _rope(rng, dtype) -> Iterator[Case]:
    yield {}, (_randn(rng, dtype, 1, 5, 4, 16), _randn(rng, dtype, 1, 5, 1, 16), _randn(rng, dtype, 1, 5, 1, 16))


def _concat(rng, dtype) -> Iterator[Case]:
    yield {"axis": 1}, (_randn(rng, dtype, 1, 7, 2, 8), _randn(rng, dtype, 1, 3, 2, 8))


def _causal_conv1d(rng, dtype) -> Iterator[Case]:
    yield {"pad": 3}, (_randn(rng, dtype, 1, 6, 12), _randn(rng, dtype, 12, 1, 4))
    yield {"pad": 0}, (_randn(rng, dtype, 1, 9, 12), _randn(rng, dtype, 12, 1, 4))


def _gated_delta_rule(rng, dtype) -> Iterator[Case]:
    for n, chunk, state in ((1, 1, True), (5, 1, False), (9, 4, True), (9, 64, False)):
        unit = [_randn(rng, dtype, 1, n, 2, 8) for _ in range(2)]
        q, k = (x / np.sqrt((x * x).sum(-1, keepdims=True)) for x in unit)
        gates = (-np.abs(_randn(rng, dtype, 1, n, 4)), 1 / (1 + np.exp(-_randn(rng, dtype, 1, n, 4))))
        extra = (_randn(rng, dtype, 1, 4, 8, 6),) if state else ()
        yield {"chunk_size": chunk, "scale": 8 ** -0.5}, (q, k, _randn(rng, dtype, 1, n, 4, 6), *gates, *extra)


CASES: dict[str, Callable[[np.random.Generator, type], Iterator[Case]]] = {
    "Gather": _gather, "RMSNorm": _norm(1), "LayerNorm": _norm(2), "MatMul": _matmul, "A16MatMul": _a16_matmul,
    "A16Gather": _a16_gather, "Reshape": _unary({"shape": [1, 5, 4, 8]}, 1, 5, 32),
    "Permute": _unary({"order": [0, 2, 1, 3]}, 1, 5, 4, 8), "Rope": _rope, "FAttention": _fattention,
    "Concat": _concat, "Add": _binary, "Mul": _binary, "Softmax": _unary({"axis": -1}, 1, 4, 5, 16),
    "Cast": _unary({}, 1, 5, 32), "Slice": _unary({"axis": 1, "start": 1, "end": 4}, 1, 5, 32),
    "Active": lambda rng, dtype: (case for mode in ("SILU", "GELU", "GELU_TANH", "SIGMOID", "SOFTPLUS")
                                  for case in _unary({"mode": mode}, 1, 5, 32)(rng, dtype)),
    "SiLU": _unary({}, 1, 5, 32), "GELU": _unary({}, 1, 5, 32), "GELUTanh": _unary({}, 1, 5, 32),
    "Sigmoid": _unary({}, 1, 5, 32), "Softplus": lambda rng, dtype: (({}, (_randn(rng, dtype, 1, 5, 32) * 12,)),),
    "L2Norm": _unary({"eps": 1e-6}, 1, 5, 2, 16), "CausalConv1d": _causal_conv1d,
    "GatedDeltaRule": _gated_delta_rule,
}


def _sum_bound(name: str, attrs: dict[str, Any], args: tuple[np.ndarray, ...], want: np.ndarray) -> np.ndarray:
    """How far a sum taken in another order may be from the spec's, elementwise: K terms of |a||b| each
    rounded once per addition, K * eps * sum |a||b| (the classic bound), and the same for the bias."""
    x = np.abs(args[0]).astype(np.float64)
    if name == "MatMul":
        w = np.abs(args[1]).astype(np.float64)
        w = w.T if attrs["right_transpose"] else w
    else:  # A16MatMul: the dequantized weight is the same exact values in both (A16Gather checks them)
        from llmbuild.op_defs.a16_matmul import dequantize
        w = np.abs(dequantize(attrs, *args[1:4])).astype(np.float64).T
    k = x.shape[-1]
    bias = np.abs(args[-1]) if len(args) in (3, 5) else 0.0
    return (k + 1) * np.finfo(want.dtype).eps * (x @ w + bias)


def _attention_bound(attrs: dict[str, Any], args: tuple[np.ndarray, ...], want: np.ndarray) -> float:
    """A blocked online softmax against one exact softmax: each probability is off by about
    (d + keys) rounding errors of the largest score, and the output is a weighted mean of the values."""
    q, k, v, _ = (np.abs(a).astype(np.float64) for a in args)
    d, keys = q.shape[-1], k.shape[1]
    largest_score = float(q.max() * k.max() * d * attrs["scale"])
    return 4 * (d + keys) * float(np.finfo(want.dtype).eps) * max(1.0, largest_score) * float(v.max())


def _names() -> list[str]:
    return sorted({op.name for op in OPS} | {form.name for op in OPS for form in op.top_forms()} | set(KERNELS))


def test_every_op_has_a_spec_kernel_and_a_case() -> None:
    for name in _names():
        assert callable(SPEC_KERNELS.get(name)), f"{name} has no spec kernel (llmbuild/op_defs/)"
        assert name in CASES, f"{name} has no case in tests/test_spec_kernels.py"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: t.__name__)
@pytest.mark.parametrize("name", _names())
def test_host_kernel_matches_its_spec(name: str, dtype: type) -> None:
    rng = np.random.default_rng(sum(map(ord, name)))
    host, spec = KERNELS[name], SPEC_KERNELS[name]
    for attrs, args in CASES[name](rng, dtype):
        got, want = host(dict(attrs), *args), spec(dict(attrs), *args)
        assert got.shape == want.shape and got.dtype == want.dtype, (attrs, got.shape, want.shape)
        # The cases are finite: a spec that gives NaN or Inf on them is wrong, whatever the host gives.
        assert np.isfinite(want).all(), attrs
        if name in ("MatMul", "A16MatMul"):
            assert (np.abs(got - want) <= _sum_bound(name, attrs, args, want)).all(), attrs
        elif name == "FAttention":
            assert np.abs(got - want).max() <= _attention_bound(attrs, args, want), attrs
        else:  # the same arithmetic in the same order: the same bits
            assert np.array_equal(got, want), attrs

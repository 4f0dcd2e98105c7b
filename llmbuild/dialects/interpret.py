"""Executes a `top` or `tpu` module with numpy: the semantics every later stage is checked against.

`reference=True` computes everything in float64 with each op's plain spec kernel (`llmbuild/op_defs/`): the
independent numpy reference for TopOp. Otherwise values are computed in float32 with the host's kernels
(numerics/kernels.py: the device's tiles and blocks) and rounded to each result's element type, which is
what the device does for `tpu` modules (bf16/f16 storage, f32 arithmetic inside each op).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from llmbuild.dialects.plain import main_func, op_attrs, string_list, tensor_info
from llmbuild.numerics.formats import round_to
from llmbuild.numerics.kernels import KERNELS, ROW_LOCAL, ROW_SKIPPING, on_real_rows
from llmbuild.numerics.stored import RowReader, materialize
from llmbuild.op_defs import SPEC_KERNELS

WeightLookup = Callable[[str], np.ndarray]


@dataclass
class Execution:
    outputs: dict[str, np.ndarray]
    by_loc: dict[str, np.ndarray] = field(default_factory=dict)  # every op's result, keyed by `loc`
    order: list[str] = field(default_factory=list)  # locs in execution order


def interpret(
    module: ModuleOp, inputs: Mapping[str, np.ndarray], weights: WeightLookup, *, reference: bool,
    active_rows: int | None = None, record: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Execution:
    """`active_rows`: only the first rows (tokens) hold real tokens; products and attention compute the
    row tiles that hold them and leave zeros after them (the checks compare real rows only). `record`:
    what of each op's result to keep in `by_loc` (the checks keep the real rows: a 2048-row prefill's
    intermediates would otherwise all stay alive). A value is dropped after its last use."""
    fn = main_func(module)
    last_use: dict[SSAValue, Operation] = {}
    for op in fn.body.block.ops:
        for v in op.operands:
            last_use[v] = op
    arg_names = string_list(fn.attributes["arg_names"])
    result_names = string_list(fn.attributes["result_names"])
    compute = np.float64 if reference else np.float32
    env: dict[SSAValue, np.ndarray] = {}
    from_weights: set[SSAValue] = set()
    for name, arg in zip(arg_names, fn.body.block.args, strict=True):
        info = tensor_info(arg.type)
        value = np.asarray(inputs[name])
        if value.shape != info.shape:
            raise ValueError(f"input {name}: expected shape {info.shape}, got {value.shape}")
        env[arg] = _to_compute(value, info.dtype, compute, reference)
    run = Execution(outputs={})
    with np.errstate(over="ignore", under="ignore"):
        for op in fn.body.block.ops:
            if isinstance(op, func.ReturnOp):
                for name, value in zip(result_names, op.operands, strict=True):
                    run.outputs[name] = env[value]
                break
            kind = op.name.split(".", 1)[1]
            info = tensor_info(op.results[0].type)
            if kind == "Input":
                result = env[op.operands[0]]
            elif kind == "Weight":
                value = weights(op.attributes["name"].data)
                # A weight read by rows (a 7B vocabulary table) stays so: kernels decode what they use.
                result = value if isinstance(value, RowReader) else _to_compute(value, info.dtype, compute, reference)
                from_weights.add(op.results[0])
            else:
                args = [env[v] for v in op.operands]
                attrs = op_attrs(op)
                if active_rows is not None and kind in ROW_SKIPPING:
                    attrs["active_rows"] = active_rows
                if kind in ("MatMul", "A16MatMul") and not module.attributes.get("tpu.groups"):
                    attrs["untiled"] = True  # TopOp: no device tiles whose sums to reproduce
                rows = info.shape[1] if len(info.shape) >= 2 else 0
                # Row-local ops on the real rows only: a 2048-row prefill checked on 64 tokens would
                # otherwise spend most of its time on the SiLU of padding.
                if active_rows is not None and kind in ROW_LOCAL and active_rows < rows:
                    cut = [v not in from_weights and a.ndim >= 2 and a.shape[1] == rows
                           for v, a in zip(op.operands, args, strict=True)]
                    result = on_real_rows(partial(_kernel, kind, attrs, info.dtype, compute, reference), args, cut,
                                          info.shape, active_rows)
                else:
                    result = _kernel(kind, attrs, info.dtype, compute, reference, *args)
            env[op.results[0]] = result
            loc = op.attributes["loc"].data
            run.by_loc[loc] = result if record is None else record(result)
            run.order.append(loc)
            for v in op.operands:
                if last_use.get(v) is op:
                    env.pop(v, None)
    return run


def _kernel(kind: str, attrs: dict, dtype: str, compute: type, reference: bool, *args: np.ndarray) -> np.ndarray:
    """One op's kernel, its result in the compute type and rounded to the op's element type. The reference
    runs the spec on whole arrays, and leaves rows past `active_rows` zero as the host's kernels do."""
    if not reference:
        return _to_compute(KERNELS[kind](attrs, *args), dtype, compute, reference)
    result = SPEC_KERNELS[kind](attrs, *(materialize(a) if isinstance(a, RowReader) else a for a in args))
    active = attrs.get("active_rows")
    if active is not None and kind in ROW_SKIPPING and result.ndim >= 2:
        result = np.array(result, dtype=np.float64)
        result[:, active:] = 0
    return _to_compute(result, dtype, compute, reference)


def _to_compute(x: np.ndarray, dtype: str, compute: type, reference: bool) -> np.ndarray:
    if dtype == "i32":
        return np.asarray(x, dtype=np.int32)
    if dtype == "u8":  # quantized levels: integers in any compute type, kept one byte each
        return np.asarray(x, dtype=np.uint8)
    if reference:
        return np.asarray(x, dtype=np.float64)
    return round_to(np.asarray(x, dtype=np.float32), dtype)

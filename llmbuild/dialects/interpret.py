"""Executes a `top` or `tpu` module with numpy: the semantics every later stage is checked against.

`reference=True` computes everything in float64 (the independent numpy reference for TopOp).
Otherwise values are computed in float32 and rounded to each result's element type, which is what the
device does for `tpu` modules (bf16/f16 storage, f32 arithmetic inside each op).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue

from llmbuild.dialects.plain import main_func, op_attrs, string_list, tensor_info
from llmbuild.numerics.formats import round_to
from llmbuild.numerics.kernels import KERNELS

WeightLookup = Callable[[str], np.ndarray]


@dataclass
class Execution:
    outputs: dict[str, np.ndarray]
    by_loc: dict[str, np.ndarray] = field(default_factory=dict)  # every op's result, keyed by `loc`
    order: list[str] = field(default_factory=list)  # locs in execution order


def interpret(
    module: ModuleOp, inputs: Mapping[str, np.ndarray], weights: WeightLookup, *, reference: bool
) -> Execution:
    fn = main_func(module)
    arg_names = string_list(fn.attributes["arg_names"])
    result_names = string_list(fn.attributes["result_names"])
    compute = np.float64 if reference else np.float32
    env: dict[SSAValue, np.ndarray] = {}
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
                result = _to_compute(weights(op.attributes["name"].data), info.dtype, compute, reference)
            else:
                args = [env[v] for v in op.operands]
                result = KERNELS[kind](op_attrs(op), *args)
                result = _to_compute(result, info.dtype, compute, reference)
            env[op.results[0]] = result
            loc = op.attributes["loc"].data
            run.by_loc[loc] = result
            run.order.append(loc)
    return run


def _to_compute(x: np.ndarray, dtype: str, compute: type, reference: bool) -> np.ndarray:
    if dtype == "i32":
        return np.asarray(x, dtype=np.int32)
    if reference:
        return np.asarray(x, dtype=np.float64)
    return round_to(np.asarray(x, dtype=np.float32), dtype)

"""Per-net numerical checks, run inside each layer's build job.

- top vs source: the TopOp net interpreted in float64 against the transformers reference, on the real
  rows of every output (hidden states, and the new k/v rows that go to the cache);
- tpu vs top: the generated program executed on the simulated device (its addresses, its element
  types) against the TopOp interpretation, for every output and every op (matched by `loc`).
Tolerances are applied later, by `llmbuild verify`, so changing them reruns no compile step.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from llmbuild.build.compile_net import CompiledNet
from llmbuild.dialects.interpret import interpret
from llmbuild.importer.nets import Shapes
from llmbuild.numerics.formats import encode
from llmbuild.passes.memory_plan import MemoryPlan
from llmbuild.runtime.device import Device
from llmbuild.verify.similarity import similarity
from llmbuild.verify.stage_cases import StageCase, stage_case


def _real(x: np.ndarray, expected: np.ndarray) -> np.ndarray:
    # batch is 1 and tokens are the outermost remaining axis: the real rows come first.
    return np.asarray(x).reshape(-1)[: expected.size]


def device_for(c: CompiledNet, plan: MemoryPlan, weights: Mapping[str, np.ndarray]) -> Device:
    size = plan.activation_base + c.program.activation_bytes + plan.alignment
    dev = Device(size, tuple(plan.regions["weight"]))
    for name in set(_weight_names(c)):
        slot = plan.weights[name]
        dev.load_bytes(slot.address, encode(np.asarray(weights[name], np.float32), slot.dtype).tobytes())
    return dev


def _weight_names(c: CompiledNet) -> list[str]:
    return [op.attributes["name"].data for op in c.tpu.walk() if op.name == "top.Weight"]


def check_case(
    c: CompiledNet, case: StageCase, weights: Mapping[str, np.ndarray], plan: MemoryPlan,
    device_weights: Mapping[str, np.ndarray] | None = None,
) -> dict:
    """`weights` as TopOp means them; `device_weights` as the device stores them (packed), if different."""
    top = interpret(c.top, case.inputs, lambda n: weights[n], reference=True)
    result: dict = {"rows": case.rows, "top_vs_source": {}, "tpu_vs_top": {"outputs": {}, "ops": []}}
    for name, expected in case.expected.items():
        result["top_vs_source"][name] = similarity(_real(top.outputs[name], expected), expected)

    dev = device_for(c, plan, weights if device_weights is None else device_weights)
    for name, value in case.inputs.items():
        dev.set_input(c.program, name, np.asarray(value, dtype=np.float32))
    traced: dict[str, np.ndarray] = {}
    dev.run(c.program, trace=lambda loc, value: traced.__setitem__(loc, value.copy()))
    for name, expected in case.expected.items():
        got = dev.get_output(c.program, name)
        result["tpu_vs_top"]["outputs"][name] = similarity(
            _real(got, expected), _real(top.outputs[name], expected)
        )
    for loc in top.order:
        if loc in traced:
            s = similarity(traced[loc], top.by_loc[loc])
            result["tpu_vs_top"]["ops"].append([loc, s["cosine"], s["euclid"]])
    return result


def check_net(
    c: CompiledNet,
    stage: str,
    layer: int,
    ref: dict[str, np.ndarray],
    weights: Mapping[str, np.ndarray],
    plan: MemoryPlan,
    shapes: Shapes,
    device_weights: Mapping[str, np.ndarray] | None = None,
) -> dict:
    return check_case(c, stage_case(stage, ref, layer, shapes), weights, plan, device_weights)


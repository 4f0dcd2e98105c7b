"""Per-net numerical checks, run inside each layer's (and the head's) build job.

- top vs source: the TopOp net interpreted in float32 against the transformers reference, on the real
  rows of every output (hidden states, and the new k/v rows that go to the cache);
- tpu vs top: the generated program against the TopOp interpretation, for every output and every op
  (matched by `loc`), on the real rows.

The program runs either on the simulated device (`faithful`: every value through global and local memory
at its address, the static net whole) or on the host path (the same program on numpy arrays, tested bit
for bit equal to the device, computing only the row tiles that hold real tokens). The build runs the
device on a few sampled layers, which catches a wrong address or layer group, and the host path on the
rest. Both read the weights from the object's memory-mapped weight file (a WeightImage), and both keep
one executor for the three stages of a layer, so each weight is decoded (dequantized) once per layer.
Tolerances are applied later, by `llmbuild verify`, so changing them reruns no compile step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from llmbuild.binary.memory_map import MemoryPlan
from llmbuild.binary.program import Program
from llmbuild.dialects.interpret import interpret
from llmbuild.runtime.device import Device
from llmbuild.runtime.host import HostExecutor
from llmbuild.runtime.weight_image import WeightImage
from llmbuild.verify.layer_check_policy import faithful_layers  # noqa: F401 (re-exported)
from llmbuild.verify.similarity import similarity
from llmbuild.verify.stage_cases import StageCase


class CheckExecutor:
    """One executor for the nets of one build job: the simulated device or the host path."""

    def __init__(self, plan: MemoryPlan, image: WeightImage, activation_bytes: int, faithful: bool):
        self.faithful = faithful
        self.plan, self.image, self.activation_bytes = plan, image, activation_bytes
        if not faithful:
            # One job's weights: keep every decoded weight (a 7B layer's projections are ~1 GB in f32).
            self.executor: Any = HostExecutor(image, tuple(plan.regions["weight"]),  # type: ignore[arg-type]
                                              cache_bytes=1 << 40)

    def start(self) -> Any:
        """The executor for the next net. The device starts from zeroed memory for each: a long prefill
        checked on its first row tiles leaves the skipped tiles' rows (keys of padding) as the zeros the
        masked attention expects, not as the previous net's activations."""
        if self.faithful:
            size = self.plan.activation_base + self.activation_bytes + self.plan.alignment
            self.executor = Device(size, tuple(self.plan.regions["weight"]), weights=self.image)  # type: ignore[arg-type]
        return self.executor

    def release(self) -> None:
        """The job is done with this layer: the host path's dequantized weights serve the next one's."""
        if not self.faithful:
            self.executor.release_weights()

    @property
    def name(self) -> str:
        return "device" if self.faithful else "host"


def _real(x: np.ndarray, expected: np.ndarray) -> np.ndarray:
    # batch is 1 and tokens are the outermost remaining axis: the real rows come first.
    return np.asarray(x).reshape(-1)[: expected.size]


def _real_rows(x: np.ndarray, tokens: int, rows: int) -> np.ndarray:
    """An op's result without the padding rows of a partly filled prefill: on axis 1, the net's tokens
    (the real ones first) or the cache rows followed by them (a k/v concat); other results whole. What
    the padding rows hold is of no consequence (the mask hides them) and differs between executors that
    compute whole row tiles and those that compute the real rows only."""
    x = np.asarray(x)
    if tokens > rows and x.ndim >= 2 and x.shape[1] >= tokens:
        return x[:, : x.shape[1] - (tokens - rows)]
    return x


def check_case(top_module: ModuleOp, program: Program, case: StageCase, top_weights: Mapping[str, Any],
               executor: CheckExecutor) -> dict:
    """`top_module`: the canonicalized TopOp net; `program`: what the build generated for it (from the
    object file); `top_weights` as TopOp means them (arrays, or RowReaders for tables too large to decode
    whole)."""
    tokens = case.tokens or case.rows
    active = case.rows if case.padded else None
    top = interpret(top_module, case.inputs, lambda n: top_weights[n], reference=False, active_rows=active,
                    record=lambda v: np.array(_real_rows(v, tokens, case.rows), copy=True))
    result: dict = {"rows": case.rows, "executor": executor.name, "top_vs_source": {},
                    "tpu_vs_top": {"outputs": {}, "ops": []}}
    for name, expected in case.expected.items():
        result["top_vs_source"][name] = similarity(_real(top.outputs[name], expected), expected)

    dev = executor.start()
    for name, value in case.inputs.items():
        dev.set_input(program, name, np.asarray(value, dtype=np.float32))
    traced: dict[str, np.ndarray] = {}

    def trace(loc: str, value: np.ndarray) -> None:
        traced[loc] = np.array(_real_rows(value, tokens, case.rows), copy=True)  # only what is compared

    # The device runs the row tiles holding the real tokens (two at least); the host path the tiles of
    # each product and attention that hold them.
    dev.run(program, trace=trace, active_rows=active)
    for name, expected in case.expected.items():
        got = dev.get_output(program, name)
        result["tpu_vs_top"]["outputs"][name] = similarity(
            _real(got, expected), _real(top.outputs[name], expected)
        )
    for loc in top.order:
        if loc in traced:
            s = similarity(traced[loc], top.by_loc[loc])
            result["tpu_vs_top"]["ops"].append([loc, s["cosine"], s["euclid"]])
    return result

"""`estimate()`: first-token latency, decode speed, DDR roofline and device memory of a model on a chip.

    FTL      = embedding(L) + every layer's prefill(L) + lm_head        (one prompt of L = prefill_length)
    decode   = embedding_cache + every layer's decode(1 row over S) + lm_head, per token
    roofline = DDR bandwidth / (weight + KV bytes a decoded token must read)

Each step is timed by `schedule.run_step` from the per-op work of `ops.py` and the chip's rates; the
efficiencies are the fitted ones (`efficiency.py`) unless given.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from llmbuild import LlmbuildError
from llmbuild.chips import Chip, load_chip
from llmbuild.cost.efficiency import Efficiency, efficiency_for
from llmbuild.cost.hardware import Rates
from llmbuild.cost.memory import MemoryEstimate, estimate_memory
from llmbuild.cost.ops import layer_kinds, lm_head_format, model_stages, model_steps
from llmbuild.cost.schedule import DEFAULT_SCHEDULE, LLMBUILD, SCHEDULES, OpTime, Schedule, run_step, time_op
from llmbuild.cost.weight_formats import weight_format
from llmbuild.families.layout import expected_shapes
from llmbuild.families.registry import get_family
from llmbuild.families.spec import ModelSpec, spec_from_json
from llmbuild.recipe_types import DEFAULT_GROUP_SIZE


@dataclass(frozen=True)
class StageCost:
    """One net kind: the work of one net, and the time its `count` nets take within their step."""

    name: str
    stage: str
    count: int
    tokens: int
    ops: tuple[OpTime, ...]
    step_latency_s: float  # all `count` nets, as scheduled within the step (launches included)

    @property
    def dma_bytes(self) -> float:
        return sum(o.dma_bytes for o in self.ops)

    @property
    def flops(self) -> float:
        return sum(o.flops for o in self.ops)

    @property
    def dma_s(self) -> float:
        return sum(o.dma_s for o in self.ops)

    @property
    def compute_s(self) -> float:
        return sum(o.compute_s for o in self.ops)

    @property
    def compute_cycles(self) -> float:
        return sum(o.compute_cycles for o in self.ops)

    @property
    def latency_s(self) -> float:
        """Per net."""
        return self.step_latency_s / self.count

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "stage": self.stage, "count": self.count, "tokens": self.tokens,
                "dma_bytes": self.dma_bytes, "flops": self.flops, "dma_s": self.dma_s, "compute_s": self.compute_s,
                "compute_cycles": self.compute_cycles, "latency_s": self.latency_s,
                "step_latency_s": self.step_latency_s, "ops": [o.to_dict() for o in self.ops]}


@dataclass(frozen=True)
class Estimate:
    architecture: str
    params: int
    chip: str
    mode: str
    group_size: int
    seq_length: int
    prefill_length: int
    position: int
    schedule: str
    efficiency: Efficiency
    calibrated: bool  # efficiencies fitted on this chip's published figures
    first_token_latency_s: float
    prefill_kv_latency_s: float  # a further L-token chunk over the whole cache (block_kv)
    decode_latency_s: float
    decode_tokens_per_s: float
    decode_bytes_per_token: float  # weights and KV history a decode step must read
    decode_roofline_tokens_per_s: float  # nominal DDR bandwidth / decode_bytes_per_token
    decode_roofline_fraction: float
    decode_sustained_fraction: float  # of the roofline at the fitted sustained DDR efficiency
    memory: MemoryEstimate
    stages: tuple[StageCost, ...]

    @property
    def device_memory_bytes(self) -> int:
        return self.memory.total_bytes

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def stage(self, name: str) -> StageCost:
        return next(s for s in self.stages if s.name == name)

    def headline(self) -> dict[str, Any]:
        """The few numbers a comparison needs."""
        keys = ("schedule", "first_token_latency_s", "decode_tokens_per_s", "decode_roofline_fraction",
                "decode_sustained_fraction", "decode_bytes_per_token")
        return {k: getattr(self, k) for k in keys}

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k not in ("memory", "stages", "efficiency")}
        data.update(
            efficiency=self.efficiency.to_dict(),
            device_memory_bytes=self.device_memory_bytes,
            device_memory_limit_bytes=self.memory.limit_bytes,
            fits=self.fits,
            memory=self.memory.to_dict(),
            stages=[s.to_dict() for s in self.stages],
        )
        return data


def _check_shapes(seq_length: int, prefill_length: int, position: int | None) -> int:
    if seq_length <= 0:
        raise LlmbuildError(f"seq_length: expected an integer > 0, got {seq_length}")
    if not 0 < prefill_length <= seq_length:
        raise LlmbuildError(f"prefill_length: expected an integer in [1, seq_length={seq_length}], "
                            f"got {prefill_length}")
    position = seq_length if position is None else position
    if not 0 < position <= seq_length:
        raise LlmbuildError(f"position: expected an integer in [1, seq_length={seq_length}], got {position}")
    return position


def param_count(spec: ModelSpec) -> int:
    """Weights of the model (the tied head counted once), from each layer kind's shapes times its count."""
    shapes = expected_shapes(replace(spec, num_layers=1))
    total = sum(math.prod(shape) for name, shape in shapes.items() if not name.startswith("layers."))
    family = get_family(spec.architecture)
    for first, count in layer_kinds(spec).values():
        total += count * sum(math.prod(shape) for shape in family.tensor_shapes_of_layer(spec, first).values())
    return total


class StepModel:
    """The nets of one model on one chip under one schedule, ready to be timed for any efficiencies."""

    def __init__(self, spec: ModelSpec, mode: str, group_size: int, chip: Chip, seq_length: int,
                 prefill_length: int, schedule: Schedule, lm_head: str = "schedule") -> None:
        self.fmt = weight_format(mode, group_size)
        self.head_fmt = lm_head_format(spec, self.fmt, lm_head, schedule.quantize_lm_head)
        self.rates = Rates(chip)
        self.schedule = schedule
        self.stages = model_stages(spec, self.fmt, seq_length, prefill_length, self.head_fmt)
        self.steps = model_steps(self.stages)

    def timed(self, eff: Efficiency) -> dict[str, list[OpTime]]:
        return {name: [time_op(op, self.rates, eff, self.schedule, self.fmt.act_dtype) for op in st.ops]
                for name, st in self.stages.items()}

    def step_times(self, step: str, eff: Efficiency, timed: dict[str, list[OpTime]] | None = None) -> list[float]:
        """Each stage's share of one `step` (prefill, decode or prefill_kv), in the order they run."""
        order = [self.stages[n] for n in self.steps[step]]
        return run_step(order, timed or self.timed(eff), self.rates, eff, self.schedule)

    def decode_bytes(self) -> float:
        """Weight and KV bytes a decode step must read, in this schedule's storage format."""
        return sum(st.count * sum(op.weight_bytes + op.kv_bytes for op in st.ops)
                   for st in (self.stages[n] for n in self.steps["decode"]))


def estimate(spec: ModelSpec, mode: str, group_size: int, chip: str | Chip, seq_length: int, prefill_length: int,
             position: int | None = None, *, schedule: Schedule | str = DEFAULT_SCHEDULE,
             efficiency: Efficiency | None = None, device_memory_bytes: int | None = None,
             lm_head: str = "schedule") -> Estimate:
    """The cost of `spec` in `mode` on `chip` with static stages of S = `seq_length`, L = `prefill_length`.

    `schedule` (schedule.py) decides what overlaps: the default `incumbent` is the calibrated one (it
    reproduces the published figures); `llmbuild` projects our compiler's schedule with the same chip
    efficiencies. `position` (default S) is where the decode step runs; the static decode net reads all S
    cache rows whatever the position (unused rows are masked), so it does not change the estimate.
    Device memory is always that of llmbuild's binary (the layout of `make_plan`). `lm_head` is a
    recipe's quantization.lm_head (float, w8, w4), or "schedule" (ops.lm_head_format) for a bare config.
    """
    chip = load_chip(chip) if isinstance(chip, str) else chip
    schedule = SCHEDULES[schedule] if isinstance(schedule, str) else schedule
    position = _check_shapes(seq_length, prefill_length, position)
    fitted, calibrated = efficiency_for(chip.name)
    eff = efficiency or fitted
    model = StepModel(spec, mode, group_size, chip, seq_length, prefill_length, schedule, lm_head)
    timed = model.timed(eff)
    step_times: dict[str, float] = {}
    stage_latency: dict[str, float] = {}
    for step, names in model.steps.items():
        times = model.step_times(step, eff, timed)
        step_times[step] = sum(times)
        for name, t in zip(names, times, strict=True):
            stage_latency.setdefault(name, t)  # embedding and lm_head: as in the first step that runs them

    must_read = model.decode_bytes()
    roofline = model.rates.ddr_bytes_per_s / must_read
    tokens_per_s = 1.0 / step_times["decode"]
    memory = estimate_memory(spec, model.fmt, seq_length, prefill_length, chip.global_alignment,
                             device_memory_bytes or chip.device_memory_bytes,
                             lm_head_format(spec, model.fmt, lm_head, LLMBUILD.quantize_lm_head))
    return Estimate(
        architecture=spec.architecture,
        params=param_count(spec),
        chip=chip.name,
        mode=mode,
        group_size=group_size,
        seq_length=seq_length,
        prefill_length=prefill_length,
        position=position,
        schedule=schedule.name,
        efficiency=eff,
        calibrated=calibrated and efficiency is None,
        first_token_latency_s=step_times["prefill"],
        prefill_kv_latency_s=step_times["prefill_kv"],
        decode_latency_s=step_times["decode"],
        decode_tokens_per_s=tokens_per_s,
        decode_bytes_per_token=must_read,
        decode_roofline_tokens_per_s=roofline,
        decode_roofline_fraction=tokens_per_s / roofline,
        decode_sustained_fraction=tokens_per_s / (roofline * eff.ddr),
        memory=memory,
        stages=tuple(StageCost(st.name, st.stage, st.count, st.tokens, tuple(timed[name]), stage_latency[name])
                     for name, st in model.stages.items()),
    )


def spec_from_dict(data: dict[str, Any]) -> ModelSpec:
    """A ModelSpec from its JSON form (spec.json, a binary's meta)."""
    try:
        return spec_from_json(data)
    except TypeError as exc:
        raise LlmbuildError(f"spec: malformed model spec: {exc}") from None


def estimate_from_meta(meta: dict[str, Any], *, schedule: Schedule | str = DEFAULT_SCHEDULE,
                       position: int | None = None) -> Estimate:
    """The estimate for a built binary's meta JSON (keys spec, mode, chip, seq_length, prefill_length;
    group_size and the memory report's device_bytes are read when present)."""
    missing = [k for k in ("spec", "mode", "chip", "seq_length", "prefill_length") if k not in meta]
    if missing:
        raise LlmbuildError(f"meta: missing {', '.join(missing)}")
    limit = (meta.get("memory") or {}).get("device_bytes")
    return estimate(spec_from_dict(meta["spec"]), meta["mode"], int(meta.get("group_size", DEFAULT_GROUP_SIZE)),
                    meta["chip"], int(meta["seq_length"]), int(meta["prefill_length"]), position,
                    schedule=schedule, device_memory_bytes=limit)

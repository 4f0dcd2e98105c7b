"""How a schedule turns per-op work into time: DMA and compute of each op, and the two engines'
overlap across a whole step (a first-token prefill, or one decode step).

The chip has one DMA engine (DDR <-> local memory) and one compute engine (the MAC array and the
vector unit issue from one instruction stream, so their times add). An op is cut into tiles of at most
a quarter of local memory; a tile is computed once loaded, and a loaded tile holds its buffer until it
is computed, with half of local memory for such buffers (double buffering). Two schedules differ in
what may overlap:

- `incumbent` (TPU-MLIR's LLM deployment, calibrated on its published figures): each op starts its DMA
  only when the previous op has finished, each net (one per layer) is launched and waited for by the
  host, the prefill attention writes its [heads, L, L] score matrix to DDR between QK^T, softmax and
  PV, and the lm_head stays in bf16/f16;
- `llmbuild` (the schedule our compiler targets): one launch per step with the nets queued back to back,
  weights of the next op and layer stream while this one computes (the DMA runs ahead as far as the
  double buffer allows), flash attention keeps scores in local memory, and an untied lm_head is stored
  in the mode's weight format.

Both fuse vector ops (norms, RoPE, SiLU, residuals) into the neighbouring matmul's tiles: TPU-MLIR's
layer groups do that too. Weights and KV history may be prefetched; activations stream tile by tile.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from llmbuild.cost.efficiency import Efficiency
from llmbuild.cost.hardware import Rates
from llmbuild.cost.ops import Op, Stage

# Materialised attention: QK^T writes the scores, softmax reads and writes them, PV reads them.
SCORE_PASSES = 4
_EDGE_TILES = 4  # tiles timed one by one at each end of an op; the middle is periodic


@dataclass(frozen=True)
class Schedule:
    name: str
    summary: str
    prefetch_across_ops: bool  # the next op's (and layer's) weights stream while this op computes
    launch_per_net: bool  # the host launches each net and waits for it; else one launch per step
    flash_attention: bool  # prefill scores stay in local memory; else they make SCORE_PASSES DDR passes
    quantize_lm_head: bool  # an untied lm_head is stored in the mode's weight format (w4/w8)
    score_passes: int = SCORE_PASSES  # DDR passes over materialised attention scores (flash_attention off)


INCUMBENT = Schedule(
    "incumbent", "TPU-MLIR/LLM-TPU as published: per-op DMA, a launch per net, scores in DDR, bf16 lm_head",
    prefetch_across_ops=False, launch_per_net=True, flash_attention=False, quantize_lm_head=False,
)
LLMBUILD = Schedule(
    "llmbuild", "weight prefetch across ops and layers, one launch per step, flash attention, quantized lm_head",
    prefetch_across_ops=True, launch_per_net=False, flash_attention=True, quantize_lm_head=True,
)
SCHEDULES = {s.name: s for s in (INCUMBENT, LLMBUILD)}
# Estimates default to the schedule whose numbers are checked against hardware (the calibration);
# llmbuild's own schedule is a projection until its code runs on a chip.
DEFAULT_SCHEDULE = INCUMBENT


@dataclass(frozen=True)
class OpTime:
    name: str
    kind: str
    dma_bytes: float
    flops: float
    eu_ops: float
    dma_s: float
    compute_s: float
    compute_cycles: float
    tiles: int

    def to_dict(self) -> dict:
        return asdict(self)


def score_traffic(op: Op, rates: Rates, schedule: Schedule) -> float:
    """DDR bytes an attention op moves beyond its inputs and outputs, under `schedule`."""
    a = op.attention
    if a is None:
        return 0.0
    if not schedule.flash_attention:
        return schedule.score_passes * a.score_elems * a.elem_bytes
    # Flash attention re-reads every key row once per further block of query rows.
    blocks = math.ceil(a.queries / rates.flash_query_rows)
    return (blocks - 1) * a.kv_rows_bytes


def time_op(op: Op, rates: Rates, eff: Efficiency, schedule: Schedule, act_dtype: str) -> OpTime:
    dma_bytes = op.weight_bytes + op.act_bytes + op.kv_bytes + score_traffic(op, rates, schedule)
    compute_s = op.flops / (rates.mac_flops_per_s(act_dtype) * eff.mac) + op.eu_ops / rates.eu_ops_per_s
    tiles = max(1, math.ceil(dma_bytes / rates.tile_bytes))
    return OpTime(
        name=op.name, kind=op.kind, dma_bytes=dma_bytes, flops=op.flops, eu_ops=op.eu_ops,
        dma_s=dma_bytes / (rates.ddr_bytes_per_s * eff.ddr), compute_s=compute_s,
        compute_cycles=compute_s * rates.clock_hz, tiles=tiles,
    )


class _Engines:
    """The DMA and compute engines' timelines, tile by tile. A tile's bytes hold a local-memory buffer
    from the start of its load to the end of its compute; the DMA runs ahead while the buffers last."""

    def __init__(self, buffer_bytes: float) -> None:
        self.buffer_bytes = buffer_bytes
        self.dma = 0.0  # when the DMA engine is next free
        self.tiu = 0.0  # when the compute engine is next free
        self.held: deque[tuple[float, float]] = deque()  # (compute end, bytes) of loaded tiles, in order

    @property
    def end(self) -> float:
        return max(self.dma, self.tiu)

    def barrier(self, extra_s: float) -> None:
        """Everything finishes, then `extra_s` passes (a host launch) before anything starts."""
        self.dma = self.tiu = self.end + extra_s
        self.held.clear()

    def _load_start(self, size: float) -> float:
        start = self.dma
        while self.held and self.held[0][0] <= start:
            self.held.popleft()
        used = sum(b for _, b in self.held)
        while self.held and used + size > self.buffer_bytes:
            end, b = self.held.popleft()  # wait for the oldest tile's compute to free its buffer
            start, used = max(start, end), used - b
        return start

    def _tile(self, d: float, c: float, size: float) -> None:
        self.dma = self._load_start(size) + d
        self.tiu = max(self.tiu, self.dma) + c
        self.held.append((self.tiu, size))

    def run(self, t: OpTime, wait_for_previous: bool) -> None:
        if wait_for_previous:  # no prefetch: this op's DMA starts when the previous op is done
            self.dma = max(self.dma, self.tiu)
        if t.dma_s == 0:  # works on what is already in local memory
            self.tiu += t.compute_s
            return
        n = t.tiles
        d, c, size = t.dma_s / n, t.compute_s / n, t.dma_bytes / n
        if n <= 2 * _EDGE_TILES:
            for _ in range(n):
                self._tile(d, c, size)
            return
        # Equal tiles settle into a period of max(d, c) after a few: time the edges, shift over the middle.
        for _ in range(_EDGE_TILES):
            self._tile(d, c, size)
        shift = (n - 2 * _EDGE_TILES) * max(d, c)
        self.dma, self.tiu = self.dma + shift, self.tiu + shift
        self.held = deque((end + shift, b) for end, b in self.held)
        for _ in range(_EDGE_TILES):
            self._tile(d, c, size)


def run_step(stages: Sequence[Stage], timed: dict[str, list[OpTime]], rates: Rates, eff: Efficiency,
             schedule: Schedule) -> list[float]:
    """Time of each stage (all its `count` nets) within one step, in order; their sum is the step's time."""
    engines = _Engines(2 * rates.tile_bytes)
    if not schedule.launch_per_net:
        engines.barrier(eff.launch_s)
    times, previous = [], 0.0
    for stage in stages:
        for _ in range(stage.count):
            if schedule.launch_per_net:
                engines.barrier(eff.launch_s)
            for t in timed[stage.name]:
                engines.run(t, wait_for_previous=not schedule.prefetch_across_ops)
        times.append(engines.end - previous)
        previous = engines.end
    return times

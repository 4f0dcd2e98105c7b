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
  double buffer allows), flash attention keeps scores in local memory (cut as the layer-group pass cuts
  it: `flash_blocks`; K and V are re-read once per tile of query rows, and every key block rescales the
  running state), and an untied lm_head is stored in the mode's weight format.

Both fuse vector ops (norms, RoPE, SiLU, residuals) into the neighbouring matmul's tiles: TPU-MLIR's
layer groups do that too. Weights and KV history may be prefetched; activations stream tile by tile.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from llmbuild.cost.efficiency import Efficiency
from llmbuild.cost.hardware import FLASH_KEY_BLOCK, FLASH_MAX_ROW_TILE, FLASH_ROW_BLOCK, FLASH_STATE_BYTES, Rates
from llmbuild.cost.ops import FLASH_RESCALE_OPS, Attention, Op, Stage

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


def _flash_bytes(a: Attention, rows: int, keys: int, kv_heads: int) -> int:
    """Local memory flash attention needs for `rows` query rows, key blocks of `keys` keys and commands
    of `kv_heads` KV heads (the layer-group pass's layout without alignment): query and output tiles and
    K, V and mask blocks, two copies each; the running state; the scores and probabilities (f32) of one
    command's heads. Every row at once: one copy of the query and output tiles (nothing to overlap)."""
    tiles = (1 if rows >= a.queries else 2) * 2 * rows * a.heads * a.head_dim * a.elem_bytes
    blocks = 2 * (2 * keys * a.kv_heads * a.head_dim + rows * keys) * a.elem_bytes
    state = FLASH_STATE_BYTES * a.heads * rows * (a.head_dim + 2)
    return tiles + blocks + state + 2 * 4 * (a.heads // a.kv_heads * kv_heads) * rows * keys


def _whole_bytes(a: Attention) -> int:
    """Local memory attention needs whole, one KV head's queries per command: q, k, v, mask and output
    held once, the scores and probabilities (f32) of one command's heads."""
    held = (2 * a.queries * a.heads + 2 * a.keys * a.kv_heads) * a.head_dim + a.queries * a.keys
    return held * a.elem_bytes + 2 * 4 * (a.heads // a.kv_heads) * a.queries * a.keys


def _query_tiles(queries: int) -> list[int]:
    """Query tiles the pass tries, largest first: every row, then halves (multiples of FLASH_ROW_BLOCK, at
    most FLASH_MAX_ROW_TILE)."""
    out, t = [queries], min(queries // 2 // FLASH_ROW_BLOCK * FLASH_ROW_BLOCK, FLASH_MAX_ROW_TILE)
    while t >= FLASH_ROW_BLOCK:
        out.append(t)
        t = t // 2 // FLASH_ROW_BLOCK * FLASH_ROW_BLOCK
    return out


def flash_blocks(a: Attention, lmem_bytes: int) -> tuple[int, int]:
    """(query tiles, key blocks) of one attention in local memory, as the layer-group pass cuts it
    (layer_group_plan.flash_layout): (1, 1) when the scores of one KV head's queries fit whole; else the largest
    query tile that fits with key blocks of FLASH_KEY_BLOCK keys and commands of one KV head, then the
    most KV heads per command and the largest power-of-two key block that fit with that tile."""
    if _whole_bytes(a) <= lmem_bytes:
        return 1, 1
    least = min(a.keys, FLASH_KEY_BLOCK)
    rows = next((r for r in _query_tiles(a.queries) if _flash_bytes(a, r, least, 1) <= lmem_bytes),
                FLASH_ROW_BLOCK)
    heads = max(h for h in range(1, a.kv_heads + 1)
                if a.kv_heads % h == 0 and (h == 1 or _flash_bytes(a, rows, least, h) <= lmem_bytes))
    keys = least
    while keys * 2 < a.keys and _flash_bytes(a, rows, keys * 2, heads) <= lmem_bytes:
        keys *= 2
    return math.ceil(a.queries / rows), math.ceil(a.keys / keys)


def score_traffic(op: Op, rates: Rates, schedule: Schedule) -> float:
    """DDR bytes an attention op moves beyond its inputs and outputs, under `schedule`."""
    a = op.attention
    if a is None:
        return 0.0
    if not schedule.flash_attention:
        return schedule.score_passes * a.score_elems * a.elem_bytes
    # Flash attention re-reads every key row (history and new) once per further tile of query rows.
    tiles, _ = flash_blocks(a, rates.chip.lmem_bytes)
    return (tiles - 1) * a.kv_rows_bytes


def flash_eu_ops(op: Op, rates: Rates, schedule: Schedule) -> float:
    """Vector work flash attention adds to the softmax: per key block, the rescaling of every query row's
    running sum and accumulator, and at the end the division by the sum."""
    a = op.attention
    if a is None or not schedule.flash_attention:
        return 0.0
    tiles, blocks = flash_blocks(a, rates.chip.lmem_bytes)
    if tiles == blocks == 1:
        return 0.0  # whole in local memory: one exact softmax
    return a.heads * a.queries * (blocks * (a.head_dim + FLASH_RESCALE_OPS) + a.head_dim)


def time_op(op: Op, rates: Rates, eff: Efficiency, schedule: Schedule, act_dtype: str) -> OpTime:
    dma_bytes = op.weight_bytes + op.act_bytes + op.kv_bytes + score_traffic(op, rates, schedule)
    eu_ops = op.eu_ops + flash_eu_ops(op, rates, schedule)
    compute_s = op.flops / (rates.mac_flops_per_s(act_dtype) * eff.mac) + eu_ops / rates.eu_ops_per_s
    tiles = max(1, math.ceil(dma_bytes / rates.tile_bytes))
    return OpTime(
        name=op.name, kind=op.kind, dma_bytes=dma_bytes, flops=op.flops, eu_ops=eu_ops,
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

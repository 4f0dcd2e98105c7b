"""The rates a chip description implies for the cost model: DDR bytes/s, MAC flops/s, vector ops/s.

Units follow the incumbent's LLM profiler, so figures compare one to one: DDR bandwidth is read as GiB/s
(64 "GB/s" on the BM1684X is 64 * 2^30 B/s, within 1% of its LPDDR4X-4266 x 128-bit 68.3 GB/s), and peak
TFLOPS are per core at 1 GHz with 1 T = 1024 * 10^9, scaled by the TPU clock. Unlike the profiler we do not
scale DDR time by the TPU clock: the DDR controller runs on its own clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmbuild.chips import Chip

GIB = 2**30
PROFILER_TERA = 1024e9
F32_BYTES = 4
# Vector work (norms, softmax, SiLU, dequantisation) is computed in f32, as the device rounds on store.
EU_COMPUTE_BYTES = F32_BYTES
# Flash attention's cut, as the layer-group pass makes it (passes/layer_group_plan.py: KEY_BLOCK_MIN, ROW_BLOCK,
# STATE_BYTES; tests/test_flash_attention.py checks they agree): key blocks of at least this many keys,
# query tiles of a multiple of ROW_BLOCK rows, the running state in f32.
FLASH_KEY_BLOCK = 256
FLASH_ROW_BLOCK = 8
FLASH_MAX_ROW_TILE = 64
FLASH_STATE_BYTES = 4


@dataclass(frozen=True)
class Rates:
    """`streams`: how many cores compute at once. A compiled net is one command stream, which runs on one
    core until the code generator splits work across cores: its timing passes 1 (cost/compiled.py); the
    spec model's estimate of what the chip can do credits every core (None)."""

    chip: Chip
    streams: int | None = None

    @property
    def cores(self) -> int:
        return self.chip.cores if self.streams is None else min(self.streams, self.chip.cores)

    @property
    def clock_hz(self) -> float:
        return self.chip.clock_ghz * 1e9

    @property
    def ddr_bytes_per_s(self) -> float:
        """Nominal DDR bandwidth, shared by every core."""
        return self.chip.ddr_bandwidth_gbps * GIB

    def mac_flops_per_s(self, dtype: str) -> float:
        """Peak MAC-array flops of the computing cores for `dtype` activations (the profiler's unit, at our
        clock)."""
        return self.chip.peak_tflops[dtype] * PROFILER_TERA * self.chip.clock_ghz * self.cores

    @property
    def eu_ops_per_s(self) -> float:
        """Vector-unit element operations per second: each lane does eu_bytes / 4 f32 ops a cycle."""
        per_cycle = self.chip.npu_lanes * self.chip.eu_bytes // EU_COMPUTE_BYTES * self.cores
        return per_cycle * self.clock_hz

    @property
    def tile_bytes(self) -> int:
        """DMA tile of a pipelined op: a quarter of local memory (two tiles in flight, plus work space)."""
        return self.chip.lmem_bytes // 4

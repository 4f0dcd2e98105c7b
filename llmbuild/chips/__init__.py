"""Chip descriptions as data: one YAML file per chip in chips/. Adding a chip is adding a file."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from llmbuild import LlmbuildError

CHIPS_DIR = Path(__file__).parent / "data"
PEAK_DTYPES = ("f32", "bf16", "f16")


@dataclass(frozen=True)
class Chip:
    name: str
    npu_lanes: int
    lmem_bytes_per_lane: int
    lmem_banks: int
    eu_bytes: int
    global_alignment: int
    # Per core, in the incumbent profiler's units: TFLOPS at 1 GHz with 1 T = 1024 * 10^9
    # (llmbuild/cost/hardware.py scales them by the clock).
    peak_tflops: dict[str, float]
    ddr_bandwidth_gbps: float  # read as GiB/s, as the profiler does; shared by all cores
    clock_ghz: float
    cores: int
    device_memory_bytes: int  # the board's default device heap; a recipe's target.device_memory_bytes overrides

    @property
    def lmem_bytes(self) -> int:
        return self.npu_lanes * self.lmem_bytes_per_lane


def known_chips() -> list[str]:
    return sorted(p.stem for p in CHIPS_DIR.glob("*.yaml"))


@cache
def load_chip(name: str) -> Chip:
    # Known names only: a binary's meta names the chip, and a name is not a path to open.
    if not isinstance(name, str) or name not in known_chips():
        raise LlmbuildError(f"unknown chip {str(name)[:40]!r}: expected one of {', '.join(known_chips())}")
    path = CHIPS_DIR / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    try:
        chip = Chip(**data)
    except TypeError as exc:
        raise LlmbuildError(f"{path}: malformed chip description: {exc}") from None
    # The cost model reads a peak for each activation type a mode computes in.
    missing = [t for t in PEAK_DTYPES if not chip.peak_tflops.get(t, 0) > 0]
    if missing:
        raise LlmbuildError(f"{path}: peak_tflops: expected a positive figure for {', '.join(missing)}")
    return chip

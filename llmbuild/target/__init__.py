"""Chip descriptions as data: one YAML file per chip in chips/. Adding a chip is adding a file."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from llmbuild import LlmbuildError

CHIPS_DIR = Path(__file__).parent / "chips"


@dataclass(frozen=True)
class Chip:
    name: str
    npu_lanes: int
    lmem_bytes_per_lane: int
    lmem_banks: int
    eu_bytes: int
    global_alignment: int
    peak_tflops: dict[str, float]
    ddr_bandwidth_gbps: float
    clock_ghz: float
    cores: int
    device_memory_bytes: int

    @property
    def lmem_bytes(self) -> int:
        return self.npu_lanes * self.lmem_bytes_per_lane


def known_chips() -> list[str]:
    return sorted(p.stem for p in CHIPS_DIR.glob("*.yaml"))


@cache
def load_chip(name: str) -> Chip:
    path = CHIPS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise LlmbuildError(f"unknown chip {name!r}: expected one of {', '.join(known_chips())}")
    data = yaml.safe_load(path.read_text())
    try:
        return Chip(**data)
    except TypeError as exc:
        raise LlmbuildError(f"{path}: malformed chip description: {exc}") from None

"""The time of one run of a vision-language model's vit net on the chip, from its flops and weight bytes:
what each family folder's `cost` module prices its net with for `llmbuild estimate` (InternVL per tile,
MiniCPM-V per slice; a built binary's perf.json times the compiled vit net instead).
"""

from __future__ import annotations

from llmbuild.chips import load_chip
from llmbuild.cost.efficiency import efficiency_for
from llmbuild.cost.hardware import Rates


def net_seconds(flops: float, weight_bytes: float, dtype: str, chip: str) -> float:
    """One run of a vision net: the slower of the MAC array on its flops and DDR reading its weights once
    (at the chip's fitted efficiencies), plus one net launch."""
    target = load_chip(chip)
    rates = Rates(target)
    eff, _ = efficiency_for(target.name)
    compute = flops / (rates.mac_flops_per_s(dtype) * eff.mac)
    dma = weight_bytes / (rates.ddr_bytes_per_s * eff.ddr)
    return eff.launch_s + max(compute, dma)

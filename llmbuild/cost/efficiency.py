"""Efficiency parameters of the cost model: what the chip achieves of its nominal figures.

Fitted for the BM1684X on the incumbent's two published end-to-end figures by
`llmbuild.cost.fit_efficiency.fit()` (docs/design.md, "The fit", the procedure; docs/performance.md the errors;
tests/test_cost_model.py checks these values still come out of the fit). No published figure exists
here for the other chips: they reuse the BM1684X's efficiencies, and estimates say `calibrated: false`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Efficiency:
    ddr: float  # sustained DMA rate as a fraction of the nominal DDR bandwidth
    mac: float  # MAC-array utilisation on matmul and attention work
    launch_s: float  # host launch and wait of one net (paid per net, or once per step)

    def to_dict(self) -> dict:
        return asdict(self)


# From `python -c "from llmbuild.cost.fit_efficiency import fit; print(fit())"`, rounded to 3 digits.
CALIBRATED: dict[str, Efficiency] = {
    "bm1684x": Efficiency(ddr=0.801, mac=0.724, launch_s=0.000173),
}
REFERENCE_CHIP = "bm1684x"


def efficiency_for(chip: str) -> tuple[Efficiency, bool]:
    """(the efficiencies to use for `chip`, whether they were fitted on that chip)."""
    if chip in CALIBRATED:
        return CALIBRATED[chip], True
    return CALIBRATED[REFERENCE_CHIP], False

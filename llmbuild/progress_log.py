"""Progress lines a long step writes to its own log: what it has done out of what it will do, the time
since it started and, when the count is known, an estimate of what remains.

The rules send a step's stdout and stderr to `build/<recipe>/logs/<step>.log` (`> {log} 2>&1`), so a
person (or `tail -f`) follows a 7B layer or the reference there. The lines go to stderr: some commands'
stdout is read by programs (`llmbuild layers` prints a count). They start with `progress:`, never with
`llmbuild: error:`, which steps/failures.py looks for. Stdlib only: the steps and verify both use it.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

PREFIX = "progress:"


def clock(seconds: float) -> str:
    """0:01:05 for 65.3 s: the form Snakemake and `time` print."""
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def duration(seconds: float) -> str:
    """4.2 s under a minute (a tiny model's stages take fractions of one), else 0:01:05."""
    return f"{seconds:.1f} s" if seconds < 60 else clock(seconds)


class StepProgress:
    """`StepProgress("reference", total=28)`, then `.done("layer 3")` after each unit of work: the line
    says `3 of 28`, the elapsed time and the time left at the pace so far. `total=None` for phases
    whose count is not known ("calibration ids ready")."""

    def __init__(self, step: str, total: int | None = None, stream: TextIO | None = None) -> None:
        self.step = step
        self.total = total
        self.count = 0
        self.started = time.monotonic()
        self.stream = stream

    def done(self, what: str) -> None:
        """One more unit of the `total` done; `what` names it."""
        self.count += 1
        self.note(what, counted=True)

    def note(self, what: str, counted: bool = False) -> None:
        """A line for a phase that does not count towards the total."""
        elapsed = time.monotonic() - self.started
        parts = [f"{PREFIX} {self.step}: {what}"]
        if counted and self.total:
            parts.append(f"{self.count} of {self.total}")
        parts.append(f"{duration(elapsed)} elapsed")
        if counted and self.total and 0 < self.count < self.total:
            # The units of one step are alike (layers of one model, tokens of one generation).
            parts.append(f"about {duration(elapsed / self.count * (self.total - self.count))} left")
        print(", ".join(parts), file=self.stream or sys.stderr, flush=True)

"""Where the zoo's files live under the build root (docs/zoo.md, "Files")."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ZooPaths:
    root: Path  # <build>/zoo

    @classmethod
    def under(cls, build_dir: str | Path) -> ZooPaths:
        return cls(Path(build_dir) / "zoo")

    def run_dir(self, run: str) -> Path:
        """One run's per-recipe results and logs (what the page job reads)."""
        return self.root / "runs" / run

    def result(self, run: str, recipe: str) -> Path:
        return self.run_dir(run) / f"{recipe}.json"

    def built(self, run: str, recipe: str) -> Path:
        """Made when every step of the recipe succeeded in this run (rules/zoo.smk, `zoo_built`)."""
        return self.run_dir(run) / f"{recipe}.built"

    def log(self, run: str) -> Path:
        """The output of the run's Snakemake run: every job's start and end (zoo/timeline.py)."""
        return self.root / "runs" / f"{run}.log"

    @property
    def history(self) -> Path:
        return self.root / "history"

    def record(self, run: str) -> Path:
        return self.history / f"{run}.json"

    @property
    def page(self) -> Path:
        return self.root / "index.html"

    def recipe_page(self, recipe: str) -> Path:
        return self.root / "recipes" / f"{recipe}.html"

    @property
    def plotly_js(self) -> Path:
        return self.root / "plotly.min.js"

    @property
    def regressions(self) -> Path:
        return self.root / "regressions.json"


def new_run_id(zoo_dir: str | Path, now: float | None = None) -> str:
    """A UTC timestamp naming this run (history records sort by name in time order); a suffix when a run
    of the same second already left files."""
    paths = ZooPaths(Path(zoo_dir))
    base = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    run, n = base, 1
    while paths.record(run).exists() or paths.run_dir(run).exists():
        run, n = f"{base}-{n}", n + 1
    return run

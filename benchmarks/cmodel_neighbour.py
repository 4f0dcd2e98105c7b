"""What a cmodel check leaves to the job beside it on a 2-core machine, with and without llmbuild's cmodel library:

    python benchmarks/cmodel_neighbour.py RECIPE [--part layer_14] [--seconds 15]

The vendor's cmodel runs each engine of the simulated chip as a thread that polls; llmbuild preloads a library
(llmbuild/runtime/cmodel_yield.c) that makes the engines yield while they poll and runs the cmodel's process
ten steps lower in priority. `llmbuild bmodel-check RECIPE --part PART` runs alone with the library off
(`LLMBUILD_CMODEL_YIELD=0`: the engines poll at normal priority) and on (the default); then a neighbour, one
thread multiplying 256 x 256 float32 matrices with numpy, runs alone for --seconds and beside the same two
checks. Prints each check's wall time and the neighbour's speed beside it, as a share of its speed alone.
The recipe's build must have made the part's bmodel (`snakemake --cores 2 RECIPE` keeps the layers' combined
files)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_NEIGHBOUR = """
import sys, time
import numpy as np
x = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
count = 0
while True:
    y = x @ x
    count += 1
    if count % 50 == 0:
        print(time.monotonic(), count, flush=True)
"""


class Neighbour:
    """The one-thread numpy loop in a process of its own, its progress read as it goes."""

    def __init__(self) -> None:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", _NEIGHBOUR], stdout=subprocess.PIPE, text=True, env=env)
        self.marks: list[tuple[float, int]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            t, n = line.split()
            self.marks.append((float(t), int(n)))

    def rate(self, start: float, end: float) -> float:
        """Products per second between two time.monotonic() instants."""
        inside = [(t, n) for t, n in self.marks if start <= t <= end]
        if len(inside) < 2:
            return float("nan")
        (t0, n0), (t1, n1) = inside[0], inside[-1]
        return (n1 - n0) / (t1 - t0)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def check(recipe: str, part: str, library: bool) -> tuple[float, float, int]:
    """(start, end, return code) of the part's cmodel check."""
    env = dict(os.environ)
    env.pop("LLMBUILD_CMODEL_YIELD", None)
    if not library:
        env["LLMBUILD_CMODEL_YIELD"] = "0"
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "llmbuild.cli", "bmodel-check", recipe, "--part", part], cwd=ROOT,
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        print(f"# bmodel-check failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    return start, time.monotonic(), done.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("--part", default="layer_14", help="the part checked (layer_I or head)")
    ap.add_argument("--seconds", type=float, default=15.0, help="the neighbour's run alone")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each check (the cmodel's time varies a lot)")
    args = ap.parse_args()
    rows = []
    for library in (False, True):  # each check alone first: its own time without a neighbour
        walls = [check(args.recipe, args.part, library) for _ in range(args.repeats)]
        rows.append((library, False, [end - begin for begin, end, _ in walls], [], any(c for *_, c in walls)))
    neighbour = Neighbour()
    try:
        time.sleep(2.0)  # started and warm
        start = time.monotonic()
        time.sleep(args.seconds)
        alone = neighbour.rate(start, time.monotonic())
        for library in (False, True):
            walls = [check(args.recipe, args.part, library) for _ in range(args.repeats)]
            rows.append((library, True, [end - begin for begin, end, _ in walls],
                         [neighbour.rate(begin, end) / alone for begin, end, _ in walls], any(c for *_, c in walls)))
    finally:
        neighbour.stop()
    print(f"{args.recipe} --part {args.part}, {args.repeats} runs each (median, then each run); "
          f"the neighbour alone: {alone:.1f} products/s\n")
    print("| cmodel | beside the neighbour | check wall s | neighbour's share of its speed alone |\n"
          "|---|---|---|---|")
    for library, beside, walls, shares, failed in rows:
        what = ("yielding, ten steps lower (the default)" if library
                else "as the vendor ships it (LLMBUILD_CMODEL_YIELD=0)")
        print(f"| {what}{' (failed)' if failed else ''} | {'yes' if beside else 'no'} | {_runs(walls, '.1f')} | "
              f"{_runs(shares, '.2f') if shares else ''} |")


def _runs(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({', '.join(format(v, fmt) for v in values)})"


if __name__ == "__main__":
    main()

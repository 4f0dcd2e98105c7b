"""`llmbuild compile`'s progress: Snakemake's own output, read line by line, shown as the steps done out of
the total, the steps running, the elapsed time and an estimate of the time left.

Snakemake 9 prints (without `--quiet`) a `Job stats:` table (jobs per rule, then `total N`), a block for
each job it starts (`rule NAME:` or `localrule NAME:`, then `jobid: N`), `Finished jobid: N (Rule: NAME)`
and `N of M steps (P%) done` as jobs end, `Error in rule NAME:` when one fails, and where it keeps its
complete log. Those lines are all this module reads; the rest stays in that log (`.snakemake/log/`).

The estimate weighs each step by its declared runtime (steps/resources.py, the `runtime` each rule
declares to a scheduler) and takes the pace from this run: when a step ends, time left = time since the
first step started x declared minutes left / declared minutes done, which then counts down until the next
step ends. The declared runtimes are generous upper bounds for a slow machine, so only their ratios are
used, never their sum.

On a terminal the bar is redrawn in place (tqdm, which the compiler's dependencies already bring) with
each finished step printed above it; anywhere else (a pipe, a CI log) plain lines, no control characters.
"""

from __future__ import annotations

import importlib.util
import queue
import re
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import TextIO

from llmbuild.progress_log import clock
from llmbuild.recipe_types import Recipe
from llmbuild.steps.snakemake_log import (
    COMPLETE_LOG,
    ERROR,
    FINISHED,
    JOB_START,
    JOBID,
    NOTHING_TO_DO,
    STATS,
    STATS_ROW,
    STEPS,
)

SHARD = re.compile(r"^(layers|checks)_(.+)_(\d+)_(\d+)$")  # rules/compile.smk, rules/verify.smk
HEARTBEAT_S = 30.0  # plain output: a line at least this often while a long step runs
REFRESH_S = 1.0  # terminal: the bar's clock


def declared_minutes(recipe: Recipe) -> Callable[[str], float]:
    """A rule's declared runtime in minutes, as the rules compute it (rules/*.smk: `resources_for`, the
    shards' per-layer runtime times their layers); 0 for the recipe's target, which runs nothing."""
    from llmbuild import LlmbuildError
    from llmbuild.frontend.config_spec import spec_without_weights
    from llmbuild.steps.resources import step_resources

    try:
        spec = spec_without_weights(recipe.source)
    except LlmbuildError:  # the build's prepare step names the problem; steps then weigh the same
        return lambda rule: 0.0 if rule == recipe.name else 1.0

    @cache
    def minutes(rule: str) -> float:
        if rule == recipe.name:
            return 0.0
        if (shard := SHARD.match(rule)) is not None:
            step = "layer" if shard[1] == "layers" else "check"
            return float(step_resources(recipe, spec, step).runtime_min * (int(shard[4]) - int(shard[3]) + 1))
        return float(step_resources(recipe, spec, rule).runtime_min)

    return minutes


def step_label(rule: str, recipe: str) -> str:
    """`layers_qwen2_tiny_0_3` -> `layers 0-3`; the recipe's own target -> `target`."""
    if rule == recipe:
        return "target"
    shard = SHARD.match(rule)
    return f"{shard[1]} {shard[3]}-{shard[4]}" if shard is not None and shard[2] == recipe else rule


@dataclass
class BuildState:
    """What Snakemake's output has said so far."""

    counts: dict[str, int] = field(default_factory=dict)  # jobs per rule to run (Job stats)
    total: int = 0
    done: int = 0
    running: dict[int, tuple[str, float]] = field(default_factory=dict)  # jobid -> (rule, started)
    done_minutes: float = 0.0
    first_started: float | None = None
    estimate: tuple[float, float] | None = None  # (seconds left, when it was made)
    failed: list[str] = field(default_factory=list)
    up_to_date: bool = False
    snakemake_log: str | None = None
    reading_stats: bool = False
    _rule: str | None = None  # the rule of the job block being read

    def feed(self, line: str, now: float, minutes: Callable[[str], float]) -> tuple[str, str] | None:
        """Update from one line; ("start" | "finish" | "fail", rule) when a job started, ended or failed."""
        line = line.rstrip("\n")
        if STATS.match(line):
            self.reading_stats, self.counts = True, {}
            return None
        if self.reading_stats:
            row = STATS_ROW.match(line.strip())
            if row is None:  # the header and its rule of dashes
                self.reading_stats = bool(line.strip())
            elif row[1] == "total":
                self.total, self.reading_stats = int(row[2]), False
            else:
                self.counts[row[1]] = int(row[2])
            return None
        if (m := JOB_START.match(line)) is not None:
            self._rule = m[2]
        elif (m := JOBID.match(line)) is not None and self._rule is not None:
            self.running[int(m[1])] = (self._rule, now)
            self.first_started = self.first_started if self.first_started is not None else now
            rule, self._rule = self._rule, None
            return ("start", rule)
        elif (m := FINISHED.match(line)) is not None:
            rule, _ = self.running.pop(int(m[1]), (m[2] or "?", now))
            self.done_minutes += minutes(rule)
            self.done += 1  # `N of M steps` follows and says the same
            if self.first_started is not None and self.done_minutes > 0:
                planned = sum(count * minutes(r) for r, count in self.counts.items())
                # None when the job table was not read, or only the target (which runs nothing) is left.
                self.estimate = None
                if planned > self.done_minutes:
                    pace = (now - self.first_started) / self.done_minutes
                    self.estimate = (pace * (planned - self.done_minutes), now)
            return ("finish", rule)
        elif (m := STEPS.match(line)) is not None:
            self.done, self.total = int(m[1]), int(m[2])
        elif (m := ERROR.match(line)) is not None:
            self.failed.append(m[1])
            self.running = {j: r for j, r in self.running.items() if r[0] != m[1]}
            return ("fail", m[1])
        elif (m := COMPLETE_LOG.match(line)) is not None:
            self.snakemake_log = m[1]
        elif line.startswith(NOTHING_TO_DO):
            self.up_to_date = True
        return None

    def seconds_left(self, now: float) -> float | None:
        """The estimate (module docstring); None before a step with a declared runtime has finished."""
        if self.estimate is None:
            return None
        left, made = self.estimate
        return max(0.0, left - (now - made))


class ProgressView:
    """Lines (plain) or a bar with lines above it (terminal), from a BuildState."""

    def __init__(self, recipe: str, minutes: Callable[[str], float], stream: TextIO, tty: bool,
                 clock_fn: Callable[[], float] = time.monotonic) -> None:
        self.recipe, self.minutes, self.stream, self.tty, self.clock = recipe, minutes, stream, tty, clock_fn
        self.state = BuildState()
        self.started = clock_fn()
        self.last_line = self.started
        self.bar = None

    def feed(self, line: str) -> None:
        now = self.clock()
        planning = self.state.reading_stats
        event = self.state.feed(line, now, self.minutes)
        if planning and not self.state.reading_stats and self.state.total:
            print(f"llmbuild compile: {self.state.total} steps to run; the time left is estimated from each "
                  "step's declared runtime (llmbuild/steps/resources.py) at this run's pace",
                  file=self.stream, flush=True)
        if event is not None and event[1] != self.recipe:  # the target runs nothing: counted, not shown
            kind, rule = event
            verb = {"start": "started", "finish": "done", "fail": "failed"}[kind]
            self._line(f"{verb} {step_label(rule, self.recipe)}", now)

    def tick(self) -> None:
        """Called about once a second: the terminal's clock, a plain line while a long step runs."""
        now = self.clock()
        if self.bar is not None:
            self.bar.set_description_str(self._status(now))
        elif not self.tty and self.state.running and now - self.last_line >= HEARTBEAT_S:
            self._line("", now)

    def close(self, ok: bool) -> None:
        now = self.clock()
        s = self.state
        if ok:
            text = "up to date: nothing to build" if s.up_to_date else "built: every step done"
        else:
            text = f"stopped: {', '.join(step_label(r, self.recipe) for r in s.failed) or 'Snakemake'} failed"
        if self.bar is not None:
            self.bar.n = s.done
            self.bar.set_description_str(self._status(now, text))
            self.bar.close()
        else:
            self._line(text, now, status=False)

    def _status(self, now: float, what: str = "") -> str:
        s = self.state
        parts = [f"{clock(now - self.started)} {what}".rstrip()]
        if any(rule != self.recipe for rule, _ in s.running.values()):
            parts.append("running: " + ", ".join(
                f"{step_label(rule, self.recipe)} ({clock(now - t)})" for rule, t in s.running.values()
                if rule != self.recipe))
        left = s.seconds_left(now)
        if left is not None and s.done < s.total and not s.failed:
            # Past the estimate while steps still run: say so rather than a clock stuck at zero.
            parts.append(f"about {clock(left)} left" if left > 0 else "longer than estimated")
        return "; ".join(parts)

    def _line(self, what: str, now: float, status: bool = True) -> None:
        s = self.state
        self.last_line = now
        counted = f"[{s.done:>{len(str(s.total))}}/{s.total}] " if s.total else ""  # none: nothing planned
        text = f"{counted}{self._status(now, what) if status else f'{clock(now - self.started)} {what}'}"
        if not self.tty:
            print(text, file=self.stream, flush=True)
            return
        if self.bar is None and s.total:
            from tqdm import tqdm

            self.bar = tqdm(total=s.total, file=self.stream, bar_format="{n_fmt}/{total_fmt} |{bar:24}| {desc}",
                            dynamic_ncols=True)
        if self.bar is None:
            print(text, file=self.stream, flush=True)
            return
        if what:
            self.bar.write(text, file=self.stream)
        self.bar.n = s.done
        self.bar.set_description_str(self._status(now))


@dataclass
class Outcome:
    returncode: int
    state: BuildState
    tail: list[str]  # Snakemake's last lines, for a failure no step explained


def run_with_progress(cmd: list[str], env: dict[str, str], recipe: str, minutes: Callable[[str], float],
                      stream: TextIO | None = None) -> Outcome:
    """Run Snakemake, showing its progress on `stream` (stderr) as it goes."""
    out = stream or sys.stderr
    tty = out.isatty() and not _dumb_terminal(env) and importlib.util.find_spec("tqdm") is not None
    view = ProgressView(recipe, minutes, out, tty)
    tail: deque[str] = deque(maxlen=60)
    lines: queue.Queue[str | None] = queue.Queue()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1)
    assert proc.stdout is not None

    def read() -> None:  # a thread, so the clock runs while a step prints nothing
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        while True:
            try:
                line = lines.get(timeout=REFRESH_S)
            except queue.Empty:
                view.tick()
                continue
            if line is None:
                break
            tail.append(line.rstrip("\n"))
            view.feed(line)
        returncode = proc.wait()
    except BaseException:  # Ctrl-C reaches Snakemake too (same process group): let it stop its jobs
        proc.wait()
        raise
    view.close(returncode == 0)
    return Outcome(returncode, view.state, list(tail))


def _dumb_terminal(env: dict[str, str]) -> bool:
    return env.get("TERM", "") in ("", "dumb")

"""Progress a person can follow: `llmbuild compile` shows steps done out of the total, the steps running, the
elapsed time and the time left, and ends with the result or the failed step's one line; the long steps
write their own progress to their logs (llmbuild/steps/progress.py, llmbuild/progress_log.py)."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

from llmbuild.progress_log import StepProgress
from llmbuild.steps.progress import ProgressView, step_label

CHECKPOINT = ROOT / "tests" / "fixtures" / "quant" / "gptq_asym_g32"  # one layer: the quickest real build
LINE = re.compile(r"^\[ *(\d+)/(\d+)\] (\d+):(\d\d):(\d\d)\b(.*)$")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # anything but \t and \n

# Snakemake 9's lines as `llmbuild compile` reads them (abridged: the blocks' other fields are ignored).
TRANSCRIPT = """Building DAG of jobs...
Job stats:
job           count
----------  -------
prepare           1
reference         1
layers_m_0_1      1
m                 1
total             4

Select jobs to execute...
[Wed Dec  2 00:35:44 2026]
localrule prepare:
    output: /b/m/spec.json
    jobid: 3
    resources: tmpdir=/tmp, runtime=2
[Wed Dec  2 00:35:45 2026]
Finished jobid: 3 (Rule: prepare)
1 of 4 steps (25%) done
[Wed Dec  2 00:35:45 2026]
localrule reference:
    jobid: 2
[Wed Dec  2 00:35:45 2026]
localrule layers_m_0_1:
    jobid: 1
Finished jobid: 1 (Rule: layers_m_0_1)
2 of 4 steps (50%) done
"""
MINUTES = {"prepare": 2.0, "reference": 6.0, "layers_m_0_1": 4.0, "m": 0.0}


def _view(tty: bool, times: list[float]) -> tuple[ProgressView, io.StringIO]:
    out = io.StringIO()
    ticks = iter(times)
    return ProgressView("m", MINUTES.__getitem__, out, tty, clock_fn=lambda: next(ticks)), out


def test_snakemake_lines_become_done_of_total_with_the_steps_running_and_the_time_left() -> None:
    lines = TRANSCRIPT.splitlines(keepends=True)
    # One clock reading when the view starts, one a line fed, then the close: seconds 0, 1, 2, ...
    view, out = _view(False, [float(t) for t in range(len(lines) + 2)])
    for line in lines:
        view.feed(line)
    view.close(ok=True)
    shown = out.getvalue().splitlines()
    assert shown[0].startswith("llmbuild compile: 4 steps to run; the time left is estimated from each step's "
                               "declared runtime")
    # Line i is fed at second i + 1: prepare starts at 15 (its jobid line) and ends at 18.
    assert shown[1] == "[0/4] 0:00:15 started prepare; running: prepare (0:00:00)"
    # prepare's 2 declared minutes took 3 s: the 10 minutes left (12 planned) at that pace are 15 s,
    assert shown[2] == "[1/4] 0:00:18 done prepare; about 0:00:15 left"
    # which count down until the next step ends;
    assert shown[4] == ("[1/4] 0:00:25 started layers 0-1; running: reference (0:00:03), layers 0-1 (0:00:00); "
                        "about 0:00:08 left")
    # then 6 of 12 declared minutes done in the 11 s since the first start: 11 s left.
    assert shown[5] == "[2/4] 0:00:26 done layers 0-1; running: reference (0:00:04); about 0:00:11 left"
    assert shown[-1] == "[2/4] 0:00:28 built: every step done"
    assert not CONTROL.search(out.getvalue())


def test_no_estimate_once_only_the_target_is_left() -> None:
    ended = ["Finished jobid: 2 (Rule: reference)\n", "3 of 4 steps (75%) done\n"]
    lines = [*TRANSCRIPT.splitlines(keepends=True), *ended]
    view, out = _view(False, [float(t) for t in range(len(lines) + 2)])
    for line in lines:
        view.feed(line)
    assert out.getvalue().splitlines()[-1] == "[3/4] 0:00:28 done reference"  # not "longer than estimated"


def test_a_failed_step_ends_the_lines_with_it() -> None:
    lines = [*TRANSCRIPT.splitlines(keepends=True)[:17], "Error in rule prepare:\n", "    jobid: 3\n"]
    view, out = _view(False, [float(t) for t in range(len(lines) + 2)])
    for line in lines:
        view.feed(line)
    view.close(ok=False)
    shown = out.getvalue().splitlines()
    assert shown[-2].endswith("failed prepare")
    assert re.fullmatch(r"\[0/4\] 0:00:\d\d stopped: prepare failed", shown[-1])


def test_a_long_step_gets_a_line_every_half_minute_in_a_pipe() -> None:
    lines = TRANSCRIPT.splitlines(keepends=True)[:22]  # reference started, still running
    times = [float(t) for t in range(len(lines) + 1)]
    view, out = _view(False, [*times, 40.0, 60.0])
    for line in lines:
        view.feed(line)
    view.tick()  # 18 s after the last line: nothing
    view.tick()  # 38 s after it: where the build is
    shown = out.getvalue().splitlines()
    # The 15 s estimated when prepare ended (at 18 s) have run out: said, not shown as 0:00:00.
    assert shown[-1] == "[1/4] 0:01:00; running: reference (0:00:38); longer than estimated"
    assert shown[-2].startswith("[1/4] 0:00:22 started reference;") and len(shown) == 5  # one line for two ticks


def test_an_up_to_date_build_says_so() -> None:
    # Snakemake 9.27's words when every output is current (tests/test_quant_build.py compiles twice).
    view, out = _view(False, [0.0, 1.0, 2.0, 3.0])
    view.feed("Building DAG of jobs...\n")
    view.feed("Nothing to be done (all requested files are present and up to date).\n")
    view.close(ok=True)
    assert out.getvalue() == "0:00:03 up to date: nothing to build\n"


def test_a_terminal_gets_a_bar_redrawn_in_place() -> None:
    lines = TRANSCRIPT.splitlines(keepends=True)
    view, out = _view(True, [float(t) for t in range(len(lines) + 2)])
    for line in lines:
        view.feed(line)
    view.close(ok=True)
    text = out.getvalue()
    assert "\r" in text and "2/4 |" in text and "built: every step done" in text


def test_rule_names_read_as_steps() -> None:
    assert step_label("layers_qwen2_tiny_f32_4_7", "qwen2_tiny_f32") == "layers 4-7"
    assert step_label("checks_m_0_0", "m") == "checks 0-0"
    assert step_label("head_check", "m") == "head_check"
    assert step_label("m", "m") == "target"


def test_a_step_says_how_far_it_is_in_its_log() -> None:
    out = io.StringIO()
    progress = StepProgress("reference forward", total=4, stream=out)
    for i in range(4):
        progress.done(f"layer {i} done")
    progress.note("saved")
    lines = out.getvalue().splitlines()
    assert re.fullmatch(r"progress: reference forward: layer 0 done, 1 of 4, \d+\.\d s elapsed, about \d+\.\d s left",
                        lines[0])
    assert re.fullmatch(r"progress: reference forward: layer 3 done, 4 of 4, \d+\.\d s elapsed", lines[3])
    assert re.fullmatch(r"progress: reference forward: saved, \d+\.\d s elapsed", lines[4])


def _compile(checkpoint: Path, out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "llmbuild.cli", "compile", str(checkpoint), "--quantize", "auto", "--chip",
           "bm1684x", "--seq-length", "64", "-o", str(out)]
    # The .llmb's steps only: the count of steps these tests read is the text build's (the vendor bmodel's
    # jobs are tests/test_bmodel_build.py's and test_quant_build's one-command compile's).
    env = dict(os.environ, LLMBUILD_BMODEL="0")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=out.parent, env=env)


def test_compile_shows_progress_and_ends_with_the_binary(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    done = _compile(CHECKPOINT, out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"{out / 'tiny.llmb'} (recipe beside it)")
    lines = done.stderr.splitlines()
    assert not CONTROL.search(done.stderr), "stderr is a pipe here: plain lines only"
    assert lines[0].startswith("llmbuild compile: 11 steps to run")
    steps = [m for m in map(LINE.match, lines[1:]) if m is not None]
    assert len(steps) == len(lines) - 1, "every line after the first is a progress line"
    counts = [int(m[1]) for m in steps]
    assert counts == sorted(counts) and {int(m[2]) for m in steps} == {11}
    seconds = [int(m[3]) * 3600 + int(m[4]) * 60 + int(m[5]) for m in steps]
    assert seconds == sorted(seconds)
    shown = "\n".join(lines)
    for step in ("prepare", "reference", "layers 0-0", "checks 0-0", "head", "link", "e2e", "verify"):
        for verb in ("started", "done"):
            assert re.search(rf"\] \d:\d\d:\d\d {verb} {step}(;|$)", shown, re.M), (verb, step)
    assert "running: reference (" in shown and re.search(r"about \d:\d\d:\d\d left", shown)
    assert re.fullmatch(r"\[11/11\] \d:\d\d:\d\d built: every step done", lines[-1])

    # The long steps' own lines, in their logs.
    logs = out / "logs"
    assert re.search(r"^progress: layer 0 of 1: decode compiled, 3 of 3, ", (logs / "layers_0-0.log").read_text(), re.M)
    assert re.search(r"^progress: check layer 0 of 1: decode checked, 3 of 3, ", (logs / "checks_0-0.log").read_text(),
                     re.M)
    reference = (logs / "reference.log").read_text()
    assert re.search(r"^progress: reference forward: layer 0 done, 1 of 1, ", reference, re.M)
    assert re.search(r"^progress: reference generate: token generated, 1 of \d+, ", reference, re.M)


def test_a_failed_compile_ends_with_the_step_s_one_line(tmp_path: Path) -> None:
    checkpoint = tmp_path / "truncated"
    shutil.copytree(CHECKPOINT, checkpoint)
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    out = tmp_path / "broken"
    done = _compile(checkpoint, out)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stdout == ""
    lines = done.stderr.splitlines()
    assert re.fullmatch(r"\[ 0/11\] \d:\d\d:\d\d stopped: prepare failed", lines[-2])
    assert lines[-1].startswith(f"llmbuild: error: {weights}: the file is truncated")
    assert lines[-1].endswith(f"(the build of {out / 'broken.yaml'}; log: {out / 'logs' / 'prepare.log'})")
    assert [line for line in lines if line.startswith("llmbuild: error:")] == [lines[-1]]

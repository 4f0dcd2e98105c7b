"""A failed step's own message, found in its log (llmbuild/steps/failures.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from llmbuild.steps.failures import step_errors, summary


def _log(build: Path, recipe: str, step: str, text: str, mtime: float) -> Path:
    log = build / recipe / "logs" / f"{step}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(text)
    os.utime(log, (mtime, mtime))
    return log


def test_the_messages_of_this_run_oldest_first(tmp_path: Path) -> None:
    now = time.time()
    _log(tmp_path, "a", "prepare", "llmbuild: error: old.yaml: stale\n", now - 100)  # an earlier run
    first = _log(tmp_path, "a", "layers_0_1", "progress\nllmbuild: error: ck/model.safetensors: tensor "
                 "'x': truncated\n", now - 5)
    _log(tmp_path, "b", "reference", "all went well\n", now - 4)
    second = _log(tmp_path, "b", "verify", "llmbuild: internal error: ValueError: boom (LLMBUILD_DEBUG=1 ...)\n",
                  now - 1)
    found = step_errors(tmp_path, now - 10)
    assert found == [(first, "llmbuild: error: ck/model.safetensors: tensor 'x': truncated"),
                     (second, "llmbuild: internal error: ValueError: boom (LLMBUILD_DEBUG=1 ...)")]
    assert summary(tmp_path, now - 10).splitlines()[0].endswith(f"(log: {first})")
    assert summary(tmp_path, now + 10) == ""


def test_a_full_disk_is_one_line_and_exit_2(monkeypatch, capsys) -> None:
    """The machine ran out of space: one line naming the file being written, not an internal error."""
    import errno

    import llmbuild.cli as cli

    def full(args) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/build/x/x.llmb")

    monkeypatch.setattr(cli, "cmd_recipes", full)
    assert cli.main(["recipes"]) == 2
    assert capsys.readouterr().err == ("llmbuild: error: /build/x/x.llmb: no space left on the device (free some, "
                                       "then rerun)\n")

    def missing(args) -> None:  # a step's input not written yet, or a temporary file already removed
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/build/x/layers/0/weights.safetensors")

    monkeypatch.setattr(cli, "cmd_recipes", missing)
    assert cli.main(["recipes"]) == 2
    assert capsys.readouterr().err == ("llmbuild: error: /build/x/layers/0/weights.safetensors: no such file (an "
                                       "earlier step writes it; `snakemake` runs the steps in order and makes it "
                                       "again)\n")

    def denied(args) -> None:
        raise OSError(errno.EACCES, "Permission denied", "/build/x")

    monkeypatch.setattr(cli, "cmd_recipes", denied)
    monkeypatch.delenv("LLMBUILD_DEBUG", raising=False)
    assert cli.main(["recipes"]) == 1
    assert capsys.readouterr().err.startswith("llmbuild: internal error: PermissionError")


def test_the_command_flushes_its_output_and_keeps_its_status_when_it_skips_teardown(tmp_path: Path) -> None:
    """`llmbuild` ends with os._exit (cli.entry): what it printed still reaches a pipe whole, and an error's
    status and one line are kept."""
    import subprocess
    import sys

    from llmbuild.recipe import list_recipes

    script = "import sys; sys.argv = ['llmbuild', *sys.argv[1:]]; from llmbuild.cli import entry; entry()"
    listed = subprocess.run([sys.executable, "-c", script, "recipes"], capture_output=True, text=True, check=False)
    assert listed.returncode == 0
    assert [line.split()[0] for line in listed.stdout.splitlines() if line.strip()][-1] == list_recipes()[-1]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    failed = subprocess.run([sys.executable, "-c", script, "prepare", str(bad)], capture_output=True, text=True,
                            check=False)
    assert failed.returncode == 2
    assert failed.stderr.startswith(f"llmbuild: error: {bad}") and failed.stderr.count("\n") == 1

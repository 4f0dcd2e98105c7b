"""The reason a build failed, brought from the step's log to the terminal.

Each rule sends its `llmbuild <verb>` output to `build/<recipe>/logs/<step>.log`, where the step's own
one-line message (`llmbuild: error: FILE: FIELD or TENSOR: ...`) names the file and what was expected.
Snakemake's own report of the failure ends with its exit status and the command; the workflow's `onerror`
handler (rules/common.smk) and `llmbuild compile` end it with the messages of the steps that failed
during this run instead.
"""

from __future__ import annotations

from pathlib import Path

MARKERS = ("llmbuild: error:", "llmbuild: internal error:")


def step_errors(build_dir: Path, since: float) -> list[tuple[Path, str]]:
    """(log, message) for every step log written since `since` (a time.time()) whose command ended with an
    llmbuild message; oldest first."""
    found = []
    for log in Path(build_dir).glob("*/logs/*.log"):
        try:
            written = log.stat().st_mtime
            if written < since:
                continue
            lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        message = next((line.strip() for line in reversed(lines) if line.startswith(MARKERS)), None)
        if message is not None:
            found.append((written, log, message))
    return [(log, message) for _, log, message in sorted(found)]


def summary(build_dir: Path, since: float) -> str:
    """What to print last: each failed step's message and its log, or "" when no step left one."""
    return "\n".join(f"{message} (log: {log})" for log, message in step_errors(build_dir, since))

"""A second thread for the host path: it runs matrix products next to the main thread.

Decoding a token reads every weight once; a matrix-vector product is bound by memory bandwidth, and one
core does not saturate it. Independent products (q/k/v, gate/up) and the two halves of a large one
(lm_head) run one on each thread, each a whole single-threaded BLAS call, so the bits are those of the
same calls made one after another. The threads wait on a queue, not by spinning: when the other core is
busy elsewhere, the helper's share simply runs later (on the core the waiting main thread left), instead
of stalling as OpenBLAS's spinning workers do (blas.py).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

Task = Callable[[], None]


class HelperThread:
    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[Task] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # one caller at a time: its submit and its wait go together
        threading.Thread(target=self._serve, name="llmbuild-host-helper", daemon=True).start()

    def _serve(self) -> None:
        while True:
            task = self._tasks.get()
            try:
                task()
                self._done.put(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
                self._done.put(exc)

    def run_beside(self, mine: Task, theirs: Task) -> None:
        """Run `theirs` on the helper while `mine` runs here; return when both are done."""
        with self._lock:
            self._tasks.put(theirs)
            try:
                mine()
            finally:
                error = self._done.get()
        if error is not None:
            raise error


_helper: HelperThread | None = None
_start = threading.Lock()


def helper() -> HelperThread | None:
    """The process's helper thread (started on first use), or None on a single-core machine."""
    global _helper
    if (os.cpu_count() or 1) < 2:
        return None
    with _start:
        if _helper is None:
            _helper = HelperThread()
    return _helper

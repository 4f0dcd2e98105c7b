"""team.py's workers: a product split over them has the bits of one thread at any thread count; a worker
that has gone to sleep wakes for the next job; a forked child and a second calling thread get correct
results; span entries pass every argument through."""

from __future__ import annotations

import multiprocessing
import threading
import time

import numpy as np
import pytest

from llmbuild.numerics import levels_product, matrix_product, team, vector_product
from llmbuild.numerics.parallel import row_spans

pytestmark = pytest.mark.skipif(not team.available() or vector_product.kernel("bf16") is None,
                                reason="the team runs on Linux x86-64 with llvmlite")


def _bf16(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    return (rng.standard_normal((n, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _one_thread(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    out = np.empty(w.shape[0], dtype=np.float32)
    run = vector_product.kernel("bf16")
    assert run is not None
    run(x.ctypes.data, w.ctypes.data, out.ctypes.data, 0, w.shape[0], w.shape[1], w.strides[0])
    return out


@pytest.mark.parametrize("threads", [2, 3, 5])
@pytest.mark.parametrize("n", [2, 7, 576, 1537])
def test_spans_over_the_workers_give_one_threads_bits(monkeypatch: pytest.MonkeyPatch, threads: int, n: int) -> None:
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", str(threads))
    monkeypatch.setattr(vector_product, "TEAM_WEIGHTS", 0)  # split even the smallest
    rng = np.random.default_rng(n)
    w, x = _bf16(rng, n, 576), rng.standard_normal(576).astype(np.float32)
    out = np.full(n, np.nan, dtype=np.float32)
    vector_product.product(x, w, out)
    assert np.array_equal(out.view(np.uint32), _one_thread(x, w).view(np.uint32))


def test_every_row_is_run_once_by_its_span(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that adds 1 to its rows: after a split over 4 threads every row holds exactly 1."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    x = np.ones(64, dtype=np.float32)
    w = np.full((1001, 64), 0x3C80, dtype=np.uint16)  # bf16 1/64: each row's product is exactly 1
    out = np.zeros(1001, dtype=np.float32)
    monkeypatch.setattr(vector_product, "TEAM_WEIGHTS", 0)
    vector_product.product(x, w, out)
    assert (out == 1).all()


def test_a_sleeping_worker_wakes_for_the_next_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    monkeypatch.setattr(vector_product, "TEAM_WEIGHTS", 0)
    rng = np.random.default_rng(1)
    w, x = _bf16(rng, 300, 128), rng.standard_normal(128).astype(np.float32)
    want = _one_thread(x, w)
    for _ in range(3):
        out = np.empty(300, dtype=np.float32)
        vector_product.product(x, w, out)
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
        time.sleep(0.05)  # far past the workers' spinning: they are asleep in the kernel when the next job comes


def _child_product(queue: multiprocessing.Queue) -> None:
    rng = np.random.default_rng(2)
    w, x = _bf16(rng, 500, 256), rng.standard_normal(256).astype(np.float32)
    vector_product.TEAM_WEIGHTS = 0
    out = np.empty(500, dtype=np.float32)
    vector_product.product(x, w, out)
    queue.put(bool(np.array_equal(out.view(np.uint32), _one_thread(x, w).view(np.uint32))))


def test_a_forked_child_makes_its_own_team(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    monkeypatch.setattr(vector_product, "TEAM_WEIGHTS", 0)
    rng = np.random.default_rng(3)
    w, x = _bf16(rng, 64, 64), rng.standard_normal(64).astype(np.float32)
    vector_product.product(x, w, np.empty(64, dtype=np.float32))  # the parent's team exists before the fork
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_product, args=(queue,))
    child.start()
    child.join(60)
    assert child.exitcode == 0 and queue.get(timeout=5) is True


def test_two_calling_threads_both_get_their_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """One holds the team, the other's product goes to the thread pool: both correct."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    monkeypatch.setattr(vector_product, "TEAM_WEIGHTS", 0)
    rng = np.random.default_rng(4)
    cases = [(_bf16(rng, 800, 512), rng.standard_normal(512).astype(np.float32)) for _ in range(2)]
    wrong: list[int] = []

    def caller(i: int) -> None:
        w, x = cases[i]
        want = _one_thread(x, w)
        for _ in range(200):
            out = np.empty(800, dtype=np.float32)
            vector_product.product(x, w, out)
            if not np.array_equal(out.view(np.uint32), want.view(np.uint32)):
                wrong.append(i)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not wrong and not any(t.is_alive() for t in threads)


def test_the_many_row_and_levels_kernels_pass_their_arguments_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """Their span entries read every argument from the array in order: a product split over the team equals
    the same product on one span."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((9, 192)).astype(np.float32), _bf16(rng, 700, 192)
    split, whole = np.empty((9, 700), np.float32), np.empty((9, 700), np.float32)
    monkeypatch.setattr(matrix_product, "PARALLEL_MACS", 0)
    matrix_product.product(x, w, split)
    monkeypatch.setattr(matrix_product, "PARALLEL_MACS", 1 << 62)
    matrix_product.product(x, w, whole)
    assert np.array_equal(split.view(np.uint32), whole.view(np.uint32))

    attrs = {"q_group_size": 64, "packed": True, "dequant_dtype": "bf16"}
    if not levels_product.supported(attrs, 256):
        pytest.skip("no 4-bit levels kernel here")
    levels = rng.integers(0, 256, size=(600, 128), dtype=np.uint8)
    scale = (rng.random((600, 4)) * 0.01).astype(np.float32)
    zero = rng.integers(0, 16, size=(600, 4)).astype(np.float32)
    xv = rng.standard_normal(256).astype(np.float32)
    split1, whole1 = np.empty(600, np.float32), np.empty(600, np.float32)
    monkeypatch.setattr(levels_product, "PARALLEL_WEIGHTS", 0)
    levels_product.product(xv, attrs, levels, scale, zero, split1)
    monkeypatch.setattr(levels_product, "PARALLEL_WEIGHTS", 1 << 62)
    levels_product.product(xv, attrs, levels, scale, zero, whole1)
    assert np.array_equal(split1.view(np.uint32), whole1.view(np.uint32))


def test_without_the_team_the_pool_runs_the_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    monkeypatch.setattr(team, "run", lambda *args: False)
    seen: list[tuple[int, int]] = []
    row_spans(10, 100, 0, lambda lo, hi: seen.append((lo, hi)), (12345, ()))
    assert sorted(seen) == [(0, 5), (5, 10)]

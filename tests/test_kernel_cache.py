"""The compiled products' machine code kept between processes: written once, handed back to LLVM after,
the same results; off or unwritable, the kernels compile as before."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from llmbuild.numerics import kernel_cache, llvm_kernels, matrix_product

pytest.importorskip("llvmlite")


def _run(engine, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    signature = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                 ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                 ctypes.c_int64)
    run = signature(engine.get_function_address("rows_product_f32"))
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    run(x.ctypes.data, x.shape[1], x.shape[0], w.ctypes.data, w.strides[0], y.ctypes.data, y.shape[1], 0,
        w.shape[0], x.shape[1])
    return y


def test_the_object_is_kept_then_used_with_the_same_bits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(kernel_cache.ENV, raising=False)
    ir = matrix_product._ir("f32")
    first = llvm_kernels.compile_ir(ir)
    kept = list((tmp_path / "llmbuild" / "kernels").glob("*.o"))
    assert len(kept) == 1 and kept[0].stat().st_size > 0
    optimized = []
    monkeypatch.setattr(kernel_cache, "store", lambda *a: optimized.append(a))
    second = llvm_kernels.compile_ir(ir)  # from the object: nothing compiled, so nothing stored
    assert not optimized
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((7, 192), dtype=np.float32), rng.standard_normal((21, 192), dtype=np.float32)
    a, b = _run(first, x, w), _run(second, x, w)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert np.array_equal(a.view(np.uint32), matrix_product.reference(x, w).view(np.uint32))


def test_another_ir_is_another_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(kernel_cache.ENV, raising=False)
    llvm_kernels.compile_ir(matrix_product._ir("f32"))
    llvm_kernels.compile_ir(matrix_product._ir("bf16"))
    assert len(list((tmp_path / "llmbuild" / "kernels").glob("*.o"))) == 2


def test_off_or_unwritable_compiles_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(kernel_cache.ENV, "0")
    llvm_kernels.compile_ir(matrix_product._ir("f32"))
    assert not (tmp_path / "llmbuild").exists()
    monkeypatch.delenv(kernel_cache.ENV)
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    engine = llvm_kernels.compile_ir(matrix_product._ir("f32"))
    assert engine.get_function_address("rows_product_f32")

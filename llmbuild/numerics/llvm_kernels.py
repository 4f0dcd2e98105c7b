"""LLVM IR compiled once per process into the host's kernels, called through ctypes.

Every compiled kernel of the host path (the products, the dequantizer, the bf16 store, the worker team, the
round-to-nearest quantizer) is LLVM IR written as text by its module and compiled here with llvmlite (numba's
compiler library, already a runtime dependency) for this CPU, at -O3 and with no fast-math flag, so that LLVM
neither reassociates nor contracts the arithmetic: the bits are the IR's. A module's kernels are compiled
together the first time one is asked for (`CompiledKernels`); the machine code is kept between processes
(kernel_cache.py).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, TypeVar

from llmbuild.numerics import kernel_cache

Key = TypeVar("Key")


class CompiledKernels:
    """A module's compiled kernels, by key: compiled together, once per process, by the first thread that
    asks (`compile` returns the key -> callable table, None where a kernel could not be built)."""

    def __init__(self, compile: Callable[[], dict[Any, Callable[..., None] | None]]):
        self._compile, self._table = compile, None
        self._lock = threading.Lock()

    def get(self, key: Any) -> Callable[..., None] | None:
        if self._table is None:
            with self._lock:
                if self._table is None:
                    self._table = self._compile()
        return self._table.get(key)


def splat(width: int, element: str, value: str) -> str:
    """An LLVM IR vector constant: `width` lanes of `element` `value`."""
    return "<" + ", ".join([f"{element} {value}"] * width) + ">"


PREFETCH_DECLARATION = "\ndeclare void @llvm.prefetch.p0(ptr, i32, i32, i32)\n"


def prefetch(pointer: str, ahead: int, name: str) -> list[str]:
    """IR asking the cache for the data `ahead` bytes past `pointer` (a hint: it never faults, past an
    array's end included); none when `ahead` is 0 (a kernel's prefetch turned off). The module declares
    PREFETCH_DECLARATION."""
    if not ahead:
        return []
    return [f"  {name} = getelementptr i8, ptr {pointer}, i64 {ahead}",
            f"  call void @llvm.prefetch.p0(ptr {name}, i32 0, i32 3, i32 1)"]


@cache
def cpu_features() -> frozenset[str]:
    """This CPU's features as LLVM names them (avx2, avx512f, avx512bf16, ...), those it has."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    return frozenset(name for name, on in llvm.get_host_cpu_features().items() if on)


_keep: list[Any] = []


def keep(engine: Any) -> None:
    """Hold an execution engine for the life of the process: it owns its kernels' machine code."""
    _keep.append(engine)


def compile_ir(ir: str) -> Any:
    """An execution engine holding the machine code of LLVM IR `ir`, compiled for this CPU at -O3 with no
    fast-math flag (so LLVM neither reassociates nor contracts the arithmetic), or that machine code as an
    earlier process compiled it (kernel_cache.py); raises when it cannot."""
    import llvmlite
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    machine = target.create_target_machine(cpu=cpu, features=features, opt=3, codemodel="jitdefault")
    module = llvm.parse_assembly(ir)
    module.verify()
    name = kernel_cache.key(ir, cpu, features, f"{llvmlite.__version__} {llvm.llvm_version_info}")
    cached = kernel_cache.load(name)
    if cached is None:  # with an object, MCJIT generates no code: the module only names the functions
        builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=3))
        builder.getModulePassManager().run(module, builder)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.set_object_cache(notify_func=lambda _module, data: kernel_cache.store(name, data),
                            getbuffer_func=lambda _module: cached)
    engine.finalize_object()
    return engine


def compile_functions(ir: str, symbols: Mapping[Key, str], signature: Any, what: str,
                      instead: str) -> dict[Key, Any]:
    """key -> the function `symbols[key]` of LLVM IR `ir` (`compile_ir`), called through the ctypes
    `signature` (ctypes releases the GIL for the call: rows split over threads run side by side), or
    through `signature[key]` when it is a mapping, where None gives the function's address (an int: a
    kernel's span entry, which team.py's compiled code calls). Where llvmlite cannot build them (an
    llvmlite without these APIs, an unknown CPU), every key is None and one warning says that `what` is
    unavailable and what runs `instead` (numpy, with the same bits)."""
    try:
        engine = compile_ir(ir)
    except Exception as error:
        warnings.warn(f"llmbuild: {what} is unavailable ({error}); {instead}", RuntimeWarning, stacklevel=4)
        return dict.fromkeys(symbols)
    keep(engine)
    table = {}
    for key, symbol in symbols.items():
        address = engine.get_function_address(symbol)
        kind = signature.get(key) if isinstance(signature, Mapping) else signature
        table[key] = address if kind is None else kind(address)
    return table

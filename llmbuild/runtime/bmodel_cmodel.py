"""Run the vendor's `.bmodel` files on the vendor's cmodel (a CPU simulator of the chip), through ctypes.

The TPU-MLIR wheel ships the runtime (`libbmrt.so`), the device library (`libbmlib.so.0`) and one
simulator per chip (`libcmodel_<chip>.so`). `libbmlib` picks the simulator with a bare
`dlopen("libcmodel.so")` resolved through its own RUNPATH (`$ORIGIN`), so the chip is chosen by what
`libcmodel.so` is *in the directory libbmlib was loaded from*. The vendor's own `model_runner` rewrites that
symlink inside the installed package, which breaks read-only installs and concurrent runs; here every
runtime library of the toolchain's `lib/` is symlinked into a private directory whose `libcmodel.so` points
at the chosen chip's simulator, and the libraries are loaded from there (the dynamic loader keeps the
symlink's directory as `$ORIGIN`). After the device is opened, `/proc/self/maps` is checked to prove which
simulator was really mapped.

A process holds one chip: the loader shares `libbmlib.so.0` (one object, one loaded simulator) between all
runtimes of a process, so asking for the other chip afterwards is an error (use a subprocess).

The C API has no header in the wheel; the struct layouts below follow LLM-TPU's `support/include/bmdef.h`
and `bmlib_runtime.h` (`bm_shape_t`, `bm_device_mem_t`, `bm_stage_info_t`, `bm_net_info_t`). Only the
fields up to `addr_mode` are read; every value read is sanity-checked so that a layout mismatch fails with
a message instead of garbage.

Nets run the way chat.cpp runs them: inputs copied into each stage's own device memories, the net launched
on its own output memories (`bmrt_launch_tensor_ex`), outputs copied back; see `CmodelRuntime.launch` for
why `bmrt_launch_data` is not used. As in chat.cpp, `BM_RUNTIME_SHARE_MEM` is set before loading: without it
those stage memories are not safe to write (dynamic nets then report wrong output shapes, and runs hang).

The simulator switches the calling thread to flush-to-zero / denormals-are-zero when the device opens; the
runtime keeps that floating-point environment to its own calls and restores the caller's (see `_FpEnv`).

`bmrt_destroy` and `bm_dev_free` must run before the interpreter tears down (the simulator's threads
otherwise crash the exit): `CmodelRuntime` is a context manager and an `atexit` hook closes what is left.
Once a bmodel has been loaded, closing does not stop the simulator: its engine threads (CORE_MAIN, TPU_BD,
TPU_GDMA, ...) poll busily until the process exits, about a core of a 2-core machine. Run the cmodel in a
process of its own (a build step, `llmbuild run --bmodel`, a subprocess), never in a long-lived one.

This module is part of the runtime: stdlib, numpy and the runtime's own numerics (bf16 bits) only.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmbuild import LlmbuildError, one_line
from llmbuild.numerics.formats import bf16_bits_to_f32, f32_to_bf16_bits
from llmbuild.runtime.bmodel_header import (  # noqa: F401 (the runtime's API)
    BMODEL_FULL_HEADER,
    BMODEL_HEADER_BYTES,
    BMODEL_MAGIC,
    CHIPS,
    bmodel_chip,
    bmodel_header,
)

# bm_data_type_t (bmdef.h) -> (name, numpy storage dtype). bfloat16 has no numpy dtype: its raw bits travel
# as uint16. INT4/UINT4 (9, 10) are packed two per byte and never appear at an LLM net's boundary.
_BM_DTYPES: dict[int, tuple[str, np.dtype]] = {
    0: ("float32", np.dtype(np.float32)),
    1: ("float16", np.dtype(np.float16)),
    2: ("int8", np.dtype(np.int8)),
    3: ("uint8", np.dtype(np.uint8)),
    4: ("int16", np.dtype(np.int16)),
    5: ("uint16", np.dtype(np.uint16)),
    6: ("int32", np.dtype(np.int32)),
    7: ("uint32", np.dtype(np.uint32)),
    8: ("bfloat16", np.dtype(np.uint16)),
}
_FLOAT_TYPES = ("float32", "float16", "bfloat16")

_BM_MAX_DIMS = 8
_BM_RUNTIME_SHARE_MEM = 1  # bm_runtime_flag_t: neuron memory shared between nets (LLM-TPU always sets it)
_SANE_COUNT = 4096  # more inputs, outputs or stages than this means the struct layout was misread


class CmodelError(LlmbuildError, RuntimeError):
    """A failure of the cmodel runtime: one line naming the net (or library, or file) at fault."""


# ----------------------------------------------------------------------------------------------------------
# C structs (LLM-TPU support/include/bmdef.h, bmlib_runtime.h)


class _BmShape(ctypes.Structure):
    _fields_ = [("num_dims", ctypes.c_int), ("dims", ctypes.c_int * _BM_MAX_DIMS)]


class _BmDeviceMem(ctypes.Structure):
    # union { struct { unsigned long device_addr; unsigned int reserved; int dmabuf_fd; } device;
    #         struct { void *system_addr; unsigned int reserved0; int reserved1; } system; } u;
    # bm_mem_flags_t flags; unsigned int size;   -> 24 bytes on LP64
    _fields_ = [("addr", ctypes.c_uint64), ("reserved", ctypes.c_uint32), ("fd", ctypes.c_int32),
                ("flags", ctypes.c_uint32), ("size", ctypes.c_uint32)]


class _BmTensor(ctypes.Structure):
    # bm_data_type_t dtype; bm_shape_t shape; bm_device_mem_t device_mem; bm_store_mode_t st_mode; -> 72 bytes
    _fields_ = [("dtype", ctypes.c_int), ("shape", _BmShape), ("device_mem", _BmDeviceMem), ("st_mode", ctypes.c_int)]


class _BmStageInfo(ctypes.Structure):
    _fields_ = [("input_shapes", ctypes.POINTER(_BmShape)), ("output_shapes", ctypes.POINTER(_BmShape)),
                ("input_mems", ctypes.POINTER(_BmDeviceMem)), ("output_mems", ctypes.POINTER(_BmDeviceMem))]


class _BmNetInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("is_dynamic", ctypes.c_bool),
        ("input_num", ctypes.c_int),
        ("input_names", ctypes.POINTER(ctypes.c_char_p)),
        ("input_dtypes", ctypes.POINTER(ctypes.c_int)),
        ("input_scales", ctypes.POINTER(ctypes.c_float)),
        ("output_num", ctypes.c_int),
        ("output_names", ctypes.POINTER(ctypes.c_char_p)),
        ("output_dtypes", ctypes.POINTER(ctypes.c_int)),
        ("output_scales", ctypes.POINTER(ctypes.c_float)),
        ("stage_num", ctypes.c_int),
        ("stages", ctypes.POINTER(_BmStageInfo)),
        ("max_input_bytes", ctypes.POINTER(ctypes.c_size_t)),
        ("max_output_bytes", ctypes.POINTER(ctypes.c_size_t)),
        ("input_zero_point", ctypes.POINTER(ctypes.c_int)),
        ("output_zero_point", ctypes.POINTER(ctypes.c_int)),
        ("input_loc_devices", ctypes.POINTER(ctypes.c_int)),
        ("output_loc_devices", ctypes.POINTER(ctypes.c_int)),
        ("core_num", ctypes.c_int),
        ("addr_mode", ctypes.c_int32),
    ]


# ----------------------------------------------------------------------------------------------------------
# What a net looks like


@dataclass(frozen=True)
class TensorInfo:
    """One input or output of a net.

    `dtype` is the chip's type name ("bfloat16", "float16", "float32", "int32", ...); `np_dtype` the numpy
    dtype of its raw host buffer (uint16 for bfloat16). `shapes[s]` is the shape in stage `s` (for a dynamic
    net: the largest shape the stage accepts)."""

    name: str
    dtype: str
    np_dtype: np.dtype
    shapes: tuple[tuple[int, ...], ...]
    max_bytes: int
    scale: float
    zero_point: int

    @property
    def is_float(self) -> bool:
        return self.dtype in _FLOAT_TYPES


@dataclass(frozen=True)
class NetInfo:
    """A net's metadata as the runtime reports it (`bmrt_get_network_info`)."""

    name: str
    is_dynamic: bool
    stage_num: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    core_num: int
    addr_mode: int  # 0 basic, 1 io_alone (decode blocks: the KV history is their own input memory)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)

    @property
    def input_dtypes(self) -> tuple[np.dtype, ...]:
        """numpy dtypes of the raw input buffers (uint16 for bfloat16; see TensorInfo.dtype for the name)."""
        return tuple(t.np_dtype for t in self.inputs)

    @property
    def output_dtypes(self) -> tuple[np.dtype, ...]:
        return tuple(t.np_dtype for t in self.outputs)

    def input_shapes(self, stage: int = 0) -> tuple[tuple[int, ...], ...]:
        return tuple(t.shapes[stage] for t in self.inputs)

    def output_shapes(self, stage: int = 0) -> tuple[tuple[int, ...], ...]:
        return tuple(t.shapes[stage] for t in self.outputs)


# ----------------------------------------------------------------------------------------------------------
# The floating-point environment


class _FpEnv:
    """Saves and restores the calling thread's floating-point environment (x86 MXCSR included).

    The simulator turns on flush-to-zero / denormals-are-zero in the thread that opens the device (and every
    thread created afterwards inherits it), which would silently change numpy's and torch's float results in
    the rest of the process. The runtime therefore keeps the simulator's environment apart: it is captured
    right after `bm_dev_request` and set only around calls into the libraries."""

    _SIZE = 64  # glibc's fenv_t is 32 bytes on x86-64; room to spare for other ABIs

    def __init__(self) -> None:
        try:
            libm = ctypes.CDLL("libm.so.6")
            self._get, self._set = libm.fegetenv, libm.fesetenv
        except (OSError, AttributeError):
            self._get = self._set = None
        else:
            for fn in (self._get, self._set):
                fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_int

    def save(self) -> ctypes.Array | None:
        if self._get is None:
            return None
        buf = ctypes.create_string_buffer(self._SIZE)
        return buf if self._get(buf) == 0 else None

    def restore(self, env: ctypes.Array | None) -> None:
        if env is not None and self._set is not None:
            self._set(env)


_FPENV = _FpEnv()


class _SimulatorFp:
    """Context manager: the simulator's FP environment inside, the caller's restored on the way out."""

    def __init__(self, sim_env: ctypes.Array | None) -> None:
        self._sim = sim_env
        self._saved: ctypes.Array | None = None

    def __enter__(self) -> None:
        self._saved = _FPENV.save()
        _FPENV.restore(self._sim)

    def __exit__(self, *exc: object) -> None:
        _FPENV.restore(self._saved)


# ----------------------------------------------------------------------------------------------------------
# Loading the libraries (once per process)


class _Libs:
    """The loaded libraries of one chip, for the whole process (the loader cannot unload them safely)."""

    def __init__(self, lib_dir: Path, chip: str) -> None:
        self.lib_dir = lib_dir
        self.chip = chip
        self.cmodel_real = (lib_dir / f"libcmodel_{chip}.so").resolve()
        self.private_dir = Path(tempfile.mkdtemp(prefix=f"llmbuild-cmodel-{chip}-"))
        try:
            link_chip_libraries(lib_dir, chip, self.private_dir)
            mode = os.RTLD_NOW | os.RTLD_GLOBAL
            # Dependencies first, by the private paths: libbmrt's NEEDED libbmlib.so.0 then resolves to the
            # object already loaded, and libbmlib's dlopen("libcmodel.so") to the private symlink.
            self.cmodel = ctypes.CDLL(str(self.private_dir / "libcmodel.so"), mode=mode)
            self.bmlib = ctypes.CDLL(str(self.private_dir / "libbmlib.so.0"), mode=mode)
            self.bmrt = ctypes.CDLL(str(self.private_dir / "libbmrt.so"), mode=mode)
        except OSError as exc:
            shutil.rmtree(self.private_dir, ignore_errors=True)
            raise CmodelError(f"{lib_dir}: cannot load the cmodel runtime for {chip}: {one_line(str(exc))}") from exc
        self._declare()

    def _declare(self) -> None:
        vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
        lib, rt = self.bmlib, self.bmrt
        lib.bm_dev_request.argtypes, lib.bm_dev_request.restype = [ctypes.POINTER(vp), i], i
        lib.bm_dev_free.argtypes, lib.bm_dev_free.restype = [vp], None
        rt.bmrt_create.argtypes, rt.bmrt_create.restype = [vp], vp
        rt.bmrt_destroy.argtypes, rt.bmrt_destroy.restype = [vp], None
        rt.bmrt_set_flags.argtypes, rt.bmrt_set_flags.restype = [vp, ctypes.c_uint32], None
        rt.bmrt_load_bmodel.argtypes, rt.bmrt_load_bmodel.restype = [vp, cp], ctypes.c_bool
        rt.bmrt_get_network_number.argtypes, rt.bmrt_get_network_number.restype = [vp], i
        rt.bmrt_get_network_names.argtypes = [vp, ctypes.POINTER(ctypes.POINTER(cp))]
        rt.bmrt_get_network_names.restype = None
        rt.bmrt_get_network_info.argtypes = [vp, cp]
        rt.bmrt_get_network_info.restype = ctypes.POINTER(_BmNetInfo)
        rt.bmrt_launch_tensor_ex.argtypes = [vp, cp, ctypes.POINTER(_BmTensor), i, ctypes.POINTER(_BmTensor), i,
                                             ctypes.c_bool, ctypes.c_bool]
        rt.bmrt_launch_tensor_ex.restype = ctypes.c_bool
        u = ctypes.c_uint
        lib.bm_memcpy_s2d_partial.argtypes, lib.bm_memcpy_s2d_partial.restype = [vp, _BmDeviceMem, vp, u], i
        lib.bm_memcpy_d2s_partial.argtypes, lib.bm_memcpy_d2s_partial.restype = [vp, vp, _BmDeviceMem, u], i
        lib.bm_thread_sync.argtypes, lib.bm_thread_sync.restype = [vp], i
        self.libc = ctypes.CDLL(None)
        self.libc.free.argtypes, self.libc.free.restype = [vp], None

    def mapped_cmodels(self) -> set[Path]:
        """The simulator files mapped into this process (their real paths, from /proc/self/maps)."""
        found: set[Path] = set()
        try:
            text = Path("/proc/self/maps").read_text()
        except OSError:
            return found
        for line in text.splitlines():
            parts = line.split(None, 5)
            if len(parts) == 6 and "/libcmodel" in parts[5]:
                found.add(Path(parts[5].strip()))
        return found

    def cleanup(self) -> None:
        shutil.rmtree(self.private_dir, ignore_errors=True)


_LIBS: _Libs | None = None
_LIBS_LOCK = threading.Lock()


# The simulator's device memory, read once per process when it starts, in hexadecimal (a decimal value is
# read as hexadecimal too). Its default holds less than a 7B binary (5.35 GB: "Memory exhausted" at load).
CMODEL_MEMORY_ENV = "CMODEL_GLOBAL_MEM_SIZE"


def _size_device_memory(chip: str) -> None:
    """The board's device memory (chips data) for the simulator, unless the caller set it: a binary that fits
    the board loads on its simulator. Host memory is used only where the loaded binary and its buffers are."""
    if CMODEL_MEMORY_ENV not in os.environ:
        from llmbuild.chips import load_chip

        os.environ[CMODEL_MEMORY_ENV] = hex(load_chip(chip).device_memory_bytes)


def link_chip_libraries(lib_dir: Path, chip: str, where: Path) -> Path:
    """`where` made a directory of links to the toolchain's runtime libraries whose `libcmodel.so` is `chip`'s
    simulator (libbmlib dlopens `libcmodel.so` from its own directory); links already there are replaced.
    The installed package is left as it is."""
    where.mkdir(parents=True, exist_ok=True)
    for entry in sorted(lib_dir.iterdir()):
        if ".so" in entry.name and entry.is_file() and entry.name != "libcmodel.so":
            (where / entry.name).unlink(missing_ok=True)
            (where / entry.name).symlink_to(entry.resolve())
    (where / "libcmodel.so").unlink(missing_ok=True)
    (where / "libcmodel.so").symlink_to((lib_dir / f"libcmodel_{chip}.so").resolve())
    return where


def _libs_for(lib_dir: Path, chip: str) -> _Libs:
    global _LIBS
    with _LIBS_LOCK:
        if _LIBS is None:
            _LIBS = _Libs(lib_dir, chip)  # its private directory is removed by _close_all at exit
        elif _LIBS.chip != chip or _LIBS.lib_dir != lib_dir:
            raise CmodelError(
                f"this process already runs the {_LIBS.chip} cmodel from {_LIBS.lib_dir}; one chip per "
                f"process (libbmlib holds one simulator): run {chip} in a subprocess")
        return _LIBS


def find_toolchain_lib(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The TPU-MLIR package's `lib/` directory: `explicit`, else $LLMBUILD_TPUMLIR_LIB, else $TPUC_ROOT/lib,
    else None. A directory qualifies when it holds libbmrt.so and libbmlib.so.0."""
    candidates = [explicit, os.environ.get("LLMBUILD_TPUMLIR_LIB")]
    if os.environ.get("TPUC_ROOT"):
        candidates.append(str(Path(os.environ["TPUC_ROOT"]) / "lib"))
    for c in candidates:
        if c and (Path(c) / "libbmrt.so").is_file() and (Path(c) / "libbmlib.so.0").is_file():
            return Path(c)
    return None


# ----------------------------------------------------------------------------------------------------------
# The runtime


class CmodelRuntime:
    """One simulated device with a bmrt runtime on it; load bmodels, inspect and launch their nets.

    `lib_dir` is the TPU-MLIR package's `lib/` (read only, never modified); `chip` is 'bm1684x' or
    'bm1688'. Use as a context manager, or call `close()`; an `atexit` hook closes whatever is left open.

    `launch` takes host arrays and returns host arrays. It runs a net the way LLM-TPU's chat.cpp does: the
    inputs are copied into the stage's own input memories and the net launched on its own output memories
    (`bmrt_launch_tensor_ex` with user memory). `bmrt_launch_data`, which lets the runtime place the
    buffers, is *not* equivalent: `block_kv_i` concatenates its history input with the new K/V by memory
    placement (a Concat with only_merge), and with launch_data's buffers the history is silently ignored.

    With `convert=True` (the default) float inputs are converted to each input's dtype (bfloat16 by
    round-to-nearest-even) and float outputs come back as float32; with `convert=False` buffers travel as raw
    bits (uint16 for bfloat16, float16 for float16), which is what chains nets bit-exactly, as the device does.
    """

    def __init__(self, lib_dir: str | os.PathLike[str], chip: str, *, device_id: int = 0) -> None:
        chip = chip.lower()
        if chip not in CHIPS:
            raise CmodelError(f"unknown chip {chip!r}; the cmodel runtime supports {', '.join(CHIPS)}")
        lib_path = Path(lib_dir).resolve()
        for needed in ("libbmrt.so", "libbmlib.so.0", f"libcmodel_{chip}.so"):
            if not (lib_path / needed).is_file():
                raise CmodelError(f"{lib_path}: no {needed} (is this the TPU-MLIR package's lib/ directory?)")
        self.chip = chip
        self.lib_dir = lib_path
        self._libs = _libs_for(lib_path, chip)
        self._lock = threading.RLock()
        self._handle = ctypes.c_void_p()
        self._bmrt: int | None = None
        self._infos: dict[str, NetInfo] = {}
        self._raw: dict[str, _BmNetInfo] = {}  # the runtime's own structs (valid while it lives)
        self.loaded: list[Path] = []  # bmodel files loaded, in order
        self.launch_seconds: dict[str, list[float]] = {}  # wall time of each launch, per net

        _size_device_memory(chip)
        caller_env = _FPENV.save()
        try:
            status = self._libs.bmlib.bm_dev_request(ctypes.byref(self._handle), device_id)
            self._sim_fp = _SimulatorFp(_FPENV.save())
        finally:
            _FPENV.restore(caller_env)
        if status != 0 or not self._handle.value:
            raise CmodelError(f"bm_dev_request({device_id}) failed on the {chip} cmodel (status {status})")
        mapped = self._libs.mapped_cmodels()
        if mapped and mapped != {self._libs.cmodel_real}:
            with self._sim_fp:
                self._libs.bmlib.bm_dev_free(self._handle)
            raise CmodelError(
                f"the {chip} cmodel was requested but {', '.join(sorted(map(str, mapped)))} is mapped "
                f"(LD_LIBRARY_PATH or LD_PRELOAD pointing at another libcmodel.so?)")
        with self._sim_fp:
            bmrt = self._libs.bmrt.bmrt_create(self._handle)
            if not bmrt:
                self._libs.bmlib.bm_dev_free(self._handle)
        if not bmrt:
            raise CmodelError(f"bmrt_create failed on the {chip} cmodel")
        with self._sim_fp:
            # As chat.cpp does, before any load: the nets' stage memories are then real, shared allocations.
            # Without it, writing a static net's outputs into its stage memory (the user-memory launch below)
            # corrupts what dynamic nets later read: their output shapes come back wrong, and runs hang.
            self._libs.bmrt.bmrt_set_flags(bmrt, _BM_RUNTIME_SHARE_MEM)
        self._bmrt = bmrt
        _OPEN.add(self)

    # -- lifetime ------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Destroy the runtime and free the device (idempotent)."""
        with self._lock:
            if self._bmrt is not None:
                with self._sim_fp:
                    self._libs.bmrt.bmrt_destroy(self._bmrt)
                    self._libs.bmlib.bm_dev_free(self._handle)
                self._bmrt = None
                self._handle = ctypes.c_void_p()
            self._infos.clear()
            self._raw.clear()
        _OPEN.discard(self)

    @property
    def simulator(self) -> Path | None:
        """The simulator library this process really mapped (from /proc/self/maps; None when unreadable)."""
        mapped = self._libs.mapped_cmodels()
        return next(iter(mapped)) if len(mapped) == 1 else None

    @property
    def closed(self) -> bool:
        return self._bmrt is None

    def __enter__(self) -> CmodelRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _need_open(self) -> int:
        if self._bmrt is None:
            raise CmodelError("the cmodel runtime is closed")
        return self._bmrt

    # -- models --------------------------------------------------------------------------------------------

    def load(self, path: str | os.PathLike[str], *, check_chip: bool = True) -> list[str]:
        """Load a bmodel file (its nets join those already loaded); returns the names of all nets.

        `check_chip=False` skips the header check and lets the runtime itself judge the chip (it refuses a
        bmodel of another chip with only a log line, "runtime arch[...] is not the same with bmodel arch")."""
        p = Path(path)
        if not p.is_file():
            raise CmodelError(f"{p}: no such bmodel file")
        built_for = bmodel_chip(p)
        if check_chip and built_for is not None and built_for != self.chip:
            raise CmodelError(f"{p}: a bmodel for {built_for}; this runtime simulates {self.chip}")
        with self._lock:
            bmrt = self._need_open()
            before = set(self.net_names())
            with self._sim_fp:
                ok = self._libs.bmrt.bmrt_load_bmodel(bmrt, str(p).encode())
            if not ok:
                raise CmodelError(f"{p}: bmrt_load_bmodel failed on the {self.chip} cmodel "
                                  f"(a bmodel for another chip, or a corrupt file; see the runtime's log above)")
            self.loaded.append(p)
            names = self.net_names()
            for n in set(names) - before:
                self._infos.pop(n, None)
                self._raw.pop(n, None)
            return names

    def net_names(self) -> list[str]:
        """Names of the loaded nets, in the runtime's order."""
        with self._lock:
            bmrt = self._need_open()
            num = self._libs.bmrt.bmrt_get_network_number(bmrt)
            if num <= 0:
                return []
            arr = ctypes.POINTER(ctypes.c_char_p)()
            self._libs.bmrt.bmrt_get_network_names(bmrt, ctypes.byref(arr))
            try:
                return [arr[i].decode() for i in range(num)]
            finally:
                self._libs.libc.free(ctypes.cast(arr, ctypes.c_void_p))

    def net_info(self, name: str) -> NetInfo:
        """A net's inputs, outputs and per-stage shapes."""
        with self._lock:
            if name in self._infos:
                return self._infos[name]
            bmrt = self._need_open()
            ptr = self._libs.bmrt.bmrt_get_network_info(bmrt, name.encode())
            if not ptr:
                raise CmodelError(f"net {one_line(name)!r}: not in the loaded bmodels "
                                  f"(nets: {', '.join(self.net_names()) or 'none'})")
            info = _read_net_info(name, ptr.contents)
            self._infos[name] = info
            self._raw[name] = ptr.contents
            return info

    # -- running -------------------------------------------------------------------------------------------

    def launch(self, name: str, inputs: Sequence[np.ndarray], stage: int = 0, *,
               convert: bool = True) -> list[np.ndarray]:
        """Run net `name` on host arrays; returns its outputs as host arrays.

        Every input must have exactly the stage's shape (a static net), or the stage's rank with no
        dimension above the stage's (a dynamic net; the outputs then come back at their real shapes).
        Inputs are validated before anything reaches the C library: the runtime aborts the process on
        some mismatches instead of returning an error.
        """
        info = self.net_info(name)
        if not 0 <= stage < info.stage_num:
            raise CmodelError(f"net {name!r}: stage {stage} out of range (it has {info.stage_num})")
        if len(inputs) != len(info.inputs):
            raise CmodelError(f"net {name!r}: {len(inputs)} inputs given, it takes {len(info.inputs)} "
                              f"({', '.join(info.input_names)})")
        bufs = [_prepare_input(name, t, np.asarray(a), stage, info.is_dynamic, convert)
                for t, a in zip(info.inputs, inputs, strict=True)]

        with self._lock:
            bmrt = self._need_open()
            raw = self._raw[name]
            st = raw.stages[stage]
            n_in, n_out = len(bufs), len(info.outputs)
            ins, outs = (_BmTensor * n_in)(), (_BmTensor * n_out)()
            lib = self._libs.bmlib
            t0 = time.perf_counter()
            with self._sim_fp:
                for k, (t, b) in enumerate(zip(info.inputs, bufs, strict=True)):
                    mem = st.input_mems[k]
                    if b.nbytes > mem.size:
                        raise CmodelError(f"net {name!r}: input {t.name!r} needs {b.nbytes} bytes, its device "
                                          f"memory has {mem.size}")
                    if lib.bm_memcpy_s2d_partial(self._handle, mem, b.ctypes.data, b.nbytes) != 0:
                        raise CmodelError(f"net {name!r}: copying input {t.name!r} to the device failed")
                    ins[k].dtype, ins[k].device_mem, ins[k].st_mode = raw.input_dtypes[k], mem, 0
                    _fill_shape(ins[k].shape, b.shape)
                for k in range(n_out):
                    outs[k].dtype, outs[k].shape = raw.output_dtypes[k], st.output_shapes[k]
                    outs[k].device_mem, outs[k].st_mode = st.output_mems[k], 0
                ok = self._libs.bmrt.bmrt_launch_tensor_ex(bmrt, name.encode(), ins, n_in, outs, n_out, True, False)
                ok = ok and lib.bm_thread_sync(self._handle) == 0
                if not ok:
                    raise CmodelError(f"net {name!r}: launch failed on the {self.chip} cmodel "
                                      f"(input shapes {[b.shape for b in bufs]})")
                results: list[np.ndarray] = []
                for k, t in enumerate(info.outputs):
                    shape = _read_shape(name, outs[k].shape)
                    if int(np.prod(shape, dtype=np.int64)) * t.np_dtype.itemsize > st.output_mems[k].size:
                        raise CmodelError(f"net {name!r}: output {t.name!r} came back with shape {shape}, "
                                          f"larger than its device memory")
                    o = np.empty(shape, dtype=t.np_dtype)
                    if lib.bm_memcpy_d2s_partial(self._handle, o.ctypes.data, st.output_mems[k], o.nbytes) != 0:
                        raise CmodelError(f"net {name!r}: copying output {t.name!r} from the device failed")
                    results.append(_convert_output(t, o) if convert else o)
            self.launch_seconds.setdefault(name, []).append(time.perf_counter() - t0)
        return results


# Runtimes still open: closed at interpreter exit, before the libraries' own teardown.
_OPEN: weakref.WeakSet[CmodelRuntime] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """At interpreter exit: every runtime still open is closed (the simulator's teardown must run before
    Python's), then the private library directory goes."""
    for rt in list(_OPEN):
        rt.close()
    if _LIBS is not None:
        _LIBS.cleanup()


# ----------------------------------------------------------------------------------------------------------
# helpers

def _fill_shape(dst: _BmShape, shape: tuple[int, ...]) -> None:
    dst.num_dims = len(shape)
    for d, v in enumerate(shape):
        dst.dims[d] = v


def _read_shape(net: str, s: _BmShape) -> tuple[int, ...]:
    if not 0 <= s.num_dims <= _BM_MAX_DIMS:
        raise CmodelError(f"net {net!r}: a shape with {s.num_dims} dims (struct layout mismatch?)")
    dims = tuple(int(s.dims[d]) for d in range(s.num_dims))
    if any(v < 0 for v in dims):
        raise CmodelError(f"net {net!r}: a negative dimension in {dims} (struct layout mismatch?)")
    return dims


def _read_net_info(name: str, raw: _BmNetInfo) -> NetInfo:
    """Copy the runtime's bm_net_info_t into Python values, checking each one is plausible."""
    counts = (raw.input_num, raw.output_num, raw.stage_num)
    if not all(0 < c <= _SANE_COUNT for c in counts):
        raise CmodelError(f"net {name!r}: implausible input/output/stage counts {counts} (struct layout "
                          f"mismatch with this libbmrt?)")

    def tensors(n: int, names, dtypes, scales, zps, max_bytes, shape_field: str) -> tuple[TensorInfo, ...]:
        out = []
        for k in range(n):
            code = int(dtypes[k])
            if code not in _BM_DTYPES:
                raise CmodelError(f"net {name!r}: tensor {k} has data type code {code}, unsupported here")
            tname, npdt = _BM_DTYPES[code]
            shapes = tuple(_read_shape(name, getattr(raw.stages[s], shape_field)[k]) for s in range(raw.stage_num))
            out.append(TensorInfo(
                name=names[k].decode(errors="replace"), dtype=tname, np_dtype=npdt, shapes=shapes,
                max_bytes=int(max_bytes[k]), scale=float(scales[k]) if scales else 1.0,
                zero_point=int(zps[k]) if zps else 0))
        return tuple(out)

    inputs = tensors(raw.input_num, raw.input_names, raw.input_dtypes, raw.input_scales, raw.input_zero_point,
                     raw.max_input_bytes, "input_shapes")
    outputs = tensors(raw.output_num, raw.output_names, raw.output_dtypes, raw.output_scales,
                      raw.output_zero_point, raw.max_output_bytes, "output_shapes")
    reported = (raw.name or b"").decode(errors="replace")
    if reported != name:
        raise CmodelError(f"net {name!r}: the runtime's info names it {reported!r} (struct layout mismatch?)")
    return NetInfo(name=name, is_dynamic=bool(raw.is_dynamic), stage_num=int(raw.stage_num), inputs=inputs,
                   outputs=outputs, core_num=int(raw.core_num), addr_mode=int(raw.addr_mode))


def _prepare_input(net: str, t: TensorInfo, a: np.ndarray, stage: int, dynamic: bool,
                   convert: bool) -> np.ndarray:
    """`a` as a contiguous buffer of `t`'s storage dtype, or a one-line error naming the net and input."""
    want = t.shapes[stage]
    if dynamic:
        ok = a.ndim == len(want) and all(0 < g <= w for g, w in zip(a.shape, want, strict=True))
        if not ok:
            raise CmodelError(f"net {net!r}: input {t.name!r} has shape {a.shape}; stage {stage} takes up to "
                              f"{want}")
    elif a.shape != want:
        raise CmodelError(f"net {net!r}: input {t.name!r} has shape {a.shape}; stage {stage} takes {want}")

    kind = a.dtype.kind
    if t.dtype == "bfloat16":
        if a.dtype == np.uint16:
            buf = a  # raw bits
        elif convert and kind == "f":
            buf = f32_to_bf16_bits(a)
        else:
            raise CmodelError(f"net {net!r}: input {t.name!r} is bfloat16; got {a.dtype} (pass uint16 raw bits"
                              f"{'' if convert else ', or a float array with convert=True'})")
    elif t.dtype == "float16":
        if a.dtype == np.float16 or (a.dtype == np.uint16 and not convert):
            buf = a.view(np.float16) if a.dtype == np.uint16 else a
        elif convert and kind == "f":
            buf = a.astype(np.float16)
        else:
            raise CmodelError(f"net {net!r}: input {t.name!r} is float16; got {a.dtype}")
    elif t.dtype == "float32":
        if a.dtype == np.float32:
            buf = a
        elif convert and kind == "f":
            buf = a.astype(np.float32)
        else:
            raise CmodelError(f"net {net!r}: input {t.name!r} is float32; got {a.dtype}")
    else:  # integer inputs (token ids, positions): exact values only, never a silent truncation
        if a.dtype == t.np_dtype:
            buf = a
        elif convert and kind in "iub":
            info = np.iinfo(t.np_dtype)
            if a.size and (a.min() < info.min or a.max() > info.max):
                raise CmodelError(f"net {net!r}: input {t.name!r} ({t.dtype}) has values outside its range")
            buf = a.astype(t.np_dtype)
        else:
            raise CmodelError(f"net {net!r}: input {t.name!r} is {t.dtype}; got {a.dtype}")
    return np.ascontiguousarray(buf)


def _convert_output(t: TensorInfo, o: np.ndarray) -> np.ndarray:
    if t.dtype == "bfloat16":
        return bf16_bits_to_f32(o)
    if t.dtype == "float16":
        return o.astype(np.float32)
    return o

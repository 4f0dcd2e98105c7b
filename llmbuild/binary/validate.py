"""A decoded program checked before anything runs it: the loader trusts nothing in a binary.

A binary's sections are checksummed, but a buggy or hostile writer signs what it writes: every index,
shape, address and size in a program is checked here against the program itself and the device memory
the binary declares, so that a bad one is one LlmbuildError naming what is wrong, never an IndexError,
a ZeroDivisionError or a 128 TiB allocation inside an executor.
"""

from __future__ import annotations

import math

from llmbuild import LlmbuildError, one_line
from llmbuild.binary.program import Instr, Program
from llmbuild.numerics.formats import STORAGE

MAX_LOCAL_BYTES = 1 << 30  # far above any chip's local memory (the BM1684X has 16 MiB)
MAX_RANK = 8


def validate_program(prog: Program, memory_bytes: int) -> None:
    """Raise LlmbuildError if `prog` is not a program a device of `memory_bytes` could run."""
    where = f"program {one_line(prog.net)}"
    if not (prog.net.isprintable() and prog.stage.isprintable()):
        raise LlmbuildError(f"{where}: net or stage name is not printable")
    if not 0 <= prog.activation_bytes <= memory_bytes:
        raise LlmbuildError(f"{where}: activation size {prog.activation_bytes} outside device memory "
                            f"of {memory_bytes} bytes")
    if not 0 <= prog.lmem_bytes <= MAX_LOCAL_BYTES:
        raise LlmbuildError(f"{where}: local memory size {prog.lmem_bytes} is not plausible")
    for i, t in enumerate(prog.tensors):
        if t.dtype not in STORAGE or len(t.shape) > MAX_RANK:
            raise LlmbuildError(f"{where}: tensor {i}: dtype {t.dtype!r} or rank {len(t.shape)} is not supported")
        nbytes = STORAGE[t.dtype][0] * math.prod(t.shape)
        limit = prog.lmem_bytes if t.local else memory_bytes
        if t.address < 0 or t.address + nbytes > limit:
            space = "local" if t.local else "device"
            raise LlmbuildError(f"{where}: tensor {i} ({t.dtype}{list(t.shape)} at {t.address}) lies outside "
                                f"{space} memory of {limit} bytes")
    count = len(prog.tensors)
    for name, index in (*prog.inputs, *prog.outputs):
        if not name.isprintable() or not 0 <= index < count:
            raise LlmbuildError(f"{where}: input or output {one_line(name)} names tensor {index} of {count}")
    _check_instrs(where, prog.instrs, count)
    for g in prog.groups:
        if g.rows < 0 or g.tile_rows < 0 or g.lmem_peak_bytes > max(prog.lmem_bytes, 0):
            raise LlmbuildError(f"{where}: group {g.index}: rows {g.rows}, tile rows {g.tile_rows} or local peak "
                                f"{g.lmem_peak_bytes} is not plausible")
        _check_instrs(f"{where}: group {g.index}", g.cmds, count)


def _check_instrs(where: str, instrs: list[Instr], count: int) -> None:
    for ins in instrs:
        if not ins.loc.isprintable():
            raise LlmbuildError(f"{where}: an instruction's location {one_line(ins.loc)} is not printable")
        for index in (*ins.operands, ins.result):
            if not 0 <= index < count:
                raise LlmbuildError(f"{where}: {ins.op} at {ins.loc} names tensor {index} of {count}")
        for key, value in ins.attrs.items():
            if not key.isprintable():
                raise LlmbuildError(f"{where}: {ins.op} at {ins.loc}: attribute name {one_line(key)}")
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 1 << 48:
                raise LlmbuildError(f"{where}: {ins.op} at {ins.loc}: attribute {key} = {value} is not plausible")

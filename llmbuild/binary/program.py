"""A net's program: a tensor table, the op list, and the layer groups the device runs.

The compiler writes it (`codegen/emit.py` from an address-assigned tpu module: the op list, every op on
global tensors, the net's semantics, which the host path runs; `codegen/groups.py` adds the groups from the
layer-grouped module: loads, stores and compute commands on local-memory tensors, what the device runs).
`encode` and `decode` give the bytes in the binary; this module needs neither xDSL nor the compiler.
Inputs and weights are tensors, not instructions; a Reshape whose result aliases its operand (the usual
case after assign-address) is a view and emits nothing.

Encoding (little-endian; docs/binary-format.md):
    u32 magic 'PRG2', str net, str stage, i32 layer, u64 activation_bytes, u64 lmem_bytes
    u32 n_tensors, then per tensor: u8 dtype, u8 rank, u32 dims[rank], u64 address, i32 buffer
    u32 n_inputs, per input: str name, u32 tensor; the same for outputs
    u32 n_instrs, then per instruction: u16 opcode, u8 n_operands, u32 operands[], u32 result,
        str loc, u8 n_attrs, per attr: str key, u8 tag, value
    u32 n_groups, per group: u32 index, u32 rows, u32 tile_rows, u64 lmem_peak_bytes, u32 n_cmds,
        then the commands, encoded as instructions
strings are u16 length + UTF-8; attribute tags: 0 i64, 1 f64, 2 bool, 3 str, 4 i64 list.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from llmbuild import LlmbuildError, one_line
from llmbuild.op_defs import OPS, OpDef

# The group commands that move data; every compute op's opcode is in its definition (llmbuild/op_defs/).
MEMORY_OPCODES = {"Load": 15, "Store": 16}


def opcode_table(defs: Iterable[OpDef]) -> dict[str, int]:
    """Op name -> opcode for the ops of `defs` and the memory commands; the codes are 1, 2, ... without a gap
    or a repeat (decode reads a code as an index)."""
    table = {op.name: op.opcode for op in defs} | MEMORY_OPCODES
    if sorted(table.values()) != list(range(1, len(table) + 1)):
        raise LlmbuildError(f"opcodes must be 1..{len(table)}, each once: {sorted(table.items(), key=lambda i: i[1])}")
    return table


OPCODE_OF = opcode_table(OPS)
OPCODES = tuple(sorted(OPCODE_OF, key=OPCODE_OF.__getitem__))  # OPCODES[code - 1] is the op
DTYPES = ("f32", "f16", "bf16", "i32", "u8")
PROG_MAGIC = b"PRG2"
OLD_MAGIC = b"PROG"  # format 1, before layer groups


@dataclass(frozen=True)
class TensorDesc:
    dtype: str
    shape: tuple[int, ...]
    address: int  # global: the device address; local (buffer >= 0): the byte offset in local memory
    buffer: int = -1  # -1: global memory; else one allocation in local memory (views share it)

    @property
    def local(self) -> bool:
        return self.buffer >= 0


@dataclass(frozen=True)
class Instr:
    op: str
    operands: tuple[int, ...]
    result: int
    loc: str
    attrs: dict[str, Any]


@dataclass
class Group:
    """One layer group as the device runs it: commands in issue order (codegen/groups.py)."""

    index: int
    rows: int
    tile_rows: int  # 0: not row-tiled
    lmem_peak_bytes: int
    cmds: list[Instr] = field(default_factory=list)


@dataclass
class Program:
    net: str
    stage: str
    layer: int
    activation_bytes: int
    tensors: list[TensorDesc] = field(default_factory=list)
    inputs: list[tuple[str, int]] = field(default_factory=list)
    outputs: list[tuple[str, int]] = field(default_factory=list)
    instrs: list[Instr] = field(default_factory=list)
    lmem_bytes: int = 0  # the local memory the groups were planned for (the chip's)
    groups: list[Group] = field(default_factory=list)


# ---- bytes ---------------------------------------------------------------------------------------


def _w_str(out: io.BytesIO, s: str) -> None:
    b = s.encode()
    out.write(struct.pack("<H", len(b)))
    out.write(b)


def _w_attr(out: io.BytesIO, key: str, value: Any) -> None:
    _w_str(out, key)
    if isinstance(value, bool):
        out.write(struct.pack("<B?", 2, value))
    elif isinstance(value, int):
        out.write(struct.pack("<Bq", 0, value))
    elif isinstance(value, float):
        out.write(struct.pack("<Bd", 1, value))
    elif isinstance(value, str):
        out.write(struct.pack("<B", 3))
        _w_str(out, value)
    elif isinstance(value, list):
        out.write(struct.pack("<BI", 4, len(value)))
        out.write(struct.pack(f"<{len(value)}q", *value))
    else:
        raise TypeError(f"attribute {key}: cannot encode {value!r}")


def _w_instrs(out: io.BytesIO, instrs: list[Instr]) -> None:
    out.write(struct.pack("<I", len(instrs)))
    for ins in instrs:
        out.write(struct.pack("<HB", OPCODE_OF[ins.op], len(ins.operands)))
        out.write(struct.pack(f"<{len(ins.operands)}I", *ins.operands))
        out.write(struct.pack("<I", ins.result))
        _w_str(out, ins.loc)
        out.write(struct.pack("<B", len(ins.attrs)))
        for key in sorted(ins.attrs):
            _w_attr(out, key, ins.attrs[key])


def encode(prog: Program) -> bytes:
    out = io.BytesIO()
    out.write(PROG_MAGIC)
    _w_str(out, prog.net)
    _w_str(out, prog.stage)
    out.write(struct.pack("<iQQI", prog.layer, prog.activation_bytes, prog.lmem_bytes, len(prog.tensors)))
    for t in prog.tensors:
        out.write(struct.pack("<BB", DTYPES.index(t.dtype), len(t.shape)))
        out.write(struct.pack(f"<{len(t.shape)}I", *t.shape))
        out.write(struct.pack("<Qi", t.address, t.buffer))
    for table in (prog.inputs, prog.outputs):
        out.write(struct.pack("<I", len(table)))
        for name, t in table:
            _w_str(out, name)
            out.write(struct.pack("<I", t))
    _w_instrs(out, prog.instrs)
    out.write(struct.pack("<I", len(prog.groups)))
    for g in prog.groups:
        out.write(struct.pack("<IIIQ", g.index, g.rows, g.tile_rows, g.lmem_peak_bytes))
        _w_instrs(out, g.cmds)
    return out.getvalue()


_STRUCTS: dict[str, struct.Struct] = {}  # a 28-layer binary's programs are millions of small fields
_U16 = struct.Struct("<H")


class _Reader:
    def __init__(self, data: bytes | memoryview):
        self.data, self.pos = bytes(data), 0
        self.end = len(self.data)
        self.strings: dict[bytes, str] = {}  # attribute keys and locs repeat: decode each once

    def take(self, fmt: str) -> tuple:
        s = _STRUCTS.get(fmt)
        if s is None:
            s = _STRUCTS[fmt] = struct.Struct("<" + fmt)
        if self.pos + s.size > self.end:
            raise LlmbuildError("program truncated")
        vals = s.unpack_from(self.data, self.pos)
        self.pos += s.size
        return vals

    def string(self) -> str:
        if self.pos + 2 > self.end:
            raise LlmbuildError("program truncated")
        (n,) = _U16.unpack_from(self.data, self.pos)
        lo, hi = self.pos + 2, self.pos + 2 + n
        if hi > self.end:
            raise LlmbuildError("program truncated (inside a string)")
        raw = self.data[lo:hi]
        s = self.strings.get(raw)
        if s is None:
            s = self.strings[raw] = raw.decode()
        self.pos = hi
        return s

    def attr(self) -> tuple[str, Any]:
        key = self.string()
        if self.pos >= self.end:
            raise LlmbuildError("program truncated")
        tag = self.data[self.pos]
        self.pos += 1
        if tag == 0:
            return key, self.take("q")[0]
        if tag == 1:
            return key, self.take("d")[0]
        if tag == 2:
            return key, self.take("?")[0]
        if tag == 3:
            return key, self.string()
        if tag == 4:
            (n,) = self.take("I")
            return key, list(self.take(f"{n}q"))
        raise LlmbuildError(f"program: unknown attribute tag {tag}")


def _r_instrs(r: _Reader, net: str) -> list[Instr]:
    out = []
    (k,) = r.take("I")
    for _ in range(k):
        code, nops = r.take("HB")
        if not 1 <= code <= len(OPCODES):
            raise LlmbuildError(f"program {net}: unknown opcode {code}")
        *operands, result = r.take(f"{nops + 1}I")
        loc = r.string()
        (na,) = r.take("B")
        attrs = dict([r.attr() for _ in range(na)])
        out.append(Instr(OPCODES[code - 1], tuple(operands), result, loc, attrs))
    return out


def _r_tensors(r: _Reader, n: int, label: str) -> list[TensorDesc]:
    """The tensor table: a layer's prefill net holds some two thousand (its groups' tiles), so each entry
    is read by one struct of its rank (the header, the shape and the address together) without `take`."""
    out, data, pos, end = [], r.data, r.pos, r.end
    by_rank: dict[int, struct.Struct] = {}
    for _ in range(n):
        if pos + 2 > end:
            raise LlmbuildError("program truncated")
        dt, rank = data[pos], data[pos + 1]
        s = by_rank.get(rank)
        if s is None:
            s = by_rank[rank] = struct.Struct(f"<{rank}IQi")
        if pos + 2 + s.size > end:
            raise LlmbuildError("program truncated")
        if dt >= len(DTYPES):
            raise LlmbuildError(f"program {label}: unknown dtype code {dt}")
        *shape, addr, buffer = s.unpack_from(data, pos + 2)
        out.append(TensorDesc(DTYPES[dt], tuple(shape), addr, buffer))
        pos += 2 + s.size
    r.pos = pos
    return out


def decode_header(data: bytes | memoryview) -> tuple[str, str, int, int]:
    """(net, stage, layer, activation bytes) of a program section, without decoding its instructions (the
    linker orders and sizes the nets from these, and decodes each program only to time it)."""
    r = _Reader(data)
    if r.data[:4] != PROG_MAGIC:
        raise LlmbuildError("not a program section (bad magic), or a program format before layer groups")
    r.pos = 4
    net, stage = r.string(), r.string()
    layer, act, _, _ = r.take("iQQI")
    return net, stage, layer, act


def decode(data: bytes | memoryview, commands: bool = True) -> Program:
    """The program in a section; a malformed one is an LlmbuildError, whatever its bytes.

    `commands=False`: the op list only, without its groups' device commands (a reader that never runs them,
    the host path: they are 99% of a long prefill's instructions, about 50 ms of decoding a layer)."""
    try:
        return _decode(data, commands)
    except (struct.error, ValueError, OverflowError, MemoryError) as exc:  # UnicodeDecodeError is a ValueError
        raise LlmbuildError(f"malformed program ({type(exc).__name__}: {exc})") from None


def _decode(data: bytes | memoryview, commands: bool = True) -> Program:
    r = _Reader(data)
    if r.data[:4] == OLD_MAGIC:
        raise LlmbuildError("program format 1 (before layer groups) is no longer read: rebuild the binary")
    if r.data[:4] != PROG_MAGIC:
        raise LlmbuildError("not a program section (bad magic)")
    r.pos = 4
    net, stage = r.string(), r.string()
    label = one_line(net)  # messages stay one printable line
    layer, act, lmem, n = r.take("iQQI")
    prog = Program(net, stage, layer, act, lmem_bytes=lmem)
    prog.tensors = _r_tensors(r, n, label)
    for table in (prog.inputs, prog.outputs):
        (k,) = r.take("I")
        for _ in range(k):
            name = r.string()
            table.append((name, r.take("I")[0]))
    prog.instrs = _r_instrs(r, label)
    if not commands:
        return prog
    (k,) = r.take("I")
    for _ in range(k):
        index, rows, tile_rows, peak = r.take("IIIQ")
        prog.groups.append(Group(index, rows, tile_rows, peak, _r_instrs(r, label)))
    if r.pos != len(r.data):
        raise LlmbuildError(f"program {label}: {len(r.data) - r.pos} trailing bytes")
    return prog

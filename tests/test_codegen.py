"""Code generation: a net's program and its bytes, and the section container of objects and binaries."""

from __future__ import annotations

import dataclasses
import hashlib
import mmap
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import plan_file
from xdsl.dialects import func

from llmbuild import LlmbuildError
from llmbuild.binary import container
from llmbuild.binary.container import Container, write_container
from llmbuild.binary.program import OPCODES, Group, Instr, Program, TensorDesc, decode, encode
from llmbuild.codegen.memory_plan import make_plan
from llmbuild.dialects.plain import main_func, string_list, tensor_info
from llmbuild.families.spec import ModelSpec
from llmbuild.importer.nets import Shapes, build_block, head_nets
from llmbuild.steps.compile_net import CompiledNet, compile_net

SPEC = ModelSpec("qwen2", 64, 2, 4, 2, 16, 128, 512, 1e-6, 10000.0, True, True, False, 256)
SHAPES = Shapes(seq_length=16, prefill_length=4)


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CompiledNet]:
    """Real nets compiled by the build's own `compile_net` (bf16, so programs carry three dtypes)."""
    plan = make_plan(SPEC, SHAPES, "bf16", 4096)
    out = tmp_path_factory.mktemp("nets")
    modules = {"block_kv_1": build_block(SPEC, 1, "prefill_kv", SHAPES), **head_nets(SPEC, SHAPES)}
    return {name: compile_net(m, plan_file(plan, out), "bf16", "bm1684x", out) for name, m in modules.items()}


# ---- programs -------------------------------------------------------------------------------------


def test_program_describes_its_module(nets: dict[str, CompiledNet]) -> None:
    c = nets["block_kv_1"]
    prog, fn = c.program, main_func(c.tpu)
    assert (prog.net, prog.stage, prog.layer) == ("block_kv_1", "prefill_kv", 1)
    assert prog.activation_bytes == c.tpu.attributes["tpu.activation_bytes"].value.data > 0
    assert [n for n, _ in prog.inputs] == string_list(fn.attributes["arg_names"])
    assert [n for n, _ in prog.outputs] == ["hidden_states", "present_k", "present_v"]
    for (_, t), arg in zip(prog.inputs, fn.body.block.args, strict=True):
        info = tensor_info(arg.type)
        assert prog.tensors[t] == TensorDesc(info.dtype, info.shape, info.address)
    # one instruction per computing op; every reshape is a view (same address) and emits nothing
    computing = [
        op
        for op in fn.body.block.ops
        if not isinstance(op, func.ReturnOp) and op.name not in ("top.Input", "top.Weight", "tpu.Reshape")
    ]
    assert [i.loc for i in prog.instrs] == [op.attributes["loc"].data for op in computing]
    assert "Reshape" not in {i.op for i in prog.instrs}
    assert {"Gather", "RMSNorm", "MatMul", "Rope", "Concat", "FAttention", "Add", "Mul", "Active"} == {
        i.op for i in prog.instrs
    }
    by_loc = {i.loc: i for i in prog.instrs}
    assert by_loc["layers.1.gate_silu"].attrs == {"mode": "SILU"}
    assert by_loc["layers.1.q_proj"].attrs == {"right_transpose": True, "do_relu": False}
    assert prog.tensors[by_loc["layers.1.rope.cos_gather"].result].dtype == "f32"
    assert len(by_loc["layers.1.q_proj"].operands) == 3  # the bias is an operand


@pytest.mark.parametrize("net", ["block_kv_1", "embedding", "embedding_cache", "lm_head"])
def test_program_bytes_round_trip(nets: dict[str, CompiledNet], net: str) -> None:
    prog = nets[net].program
    data = encode(prog)
    back = decode(data)
    assert back == prog
    assert encode(back) == data
    # attribute values keep their Python types (a bool is not an int 1, a float not truncated)
    for a, b in zip(prog.instrs, back.instrs, strict=True):
        assert {k: type(v) for k, v in a.attrs.items()} == {k: type(v) for k, v in b.attrs.items()}


def test_program_round_trips_every_attribute_kind() -> None:
    attrs = {"shape": [1, -6], "x": 2**40, "y": -1.5e-300, "z": True, "s": "ok"}
    prog = Program(
        "n",
        "decode",
        -1,
        1 << 40,
        [TensorDesc("f32", (1, 2, 3), 2**40), TensorDesc("f16", (), 64), TensorDesc("i32", (7,), 0)],
        [("a", 0)],
        [("b", 1)],
        [Instr("Reshape", (0, 2), 1, "ünïcode", attrs)],
    )
    assert decode(encode(prog)) == prog


def test_program_encoding_follows_the_documented_layout() -> None:
    # docs/binary-format.md, written out by hand: a runtime in another language reads these bytes.
    prog = Program(
        "lm_head",
        "head",
        -1,
        128,
        [TensorDesc("bf16", (1, 16), 4096), TensorDesc("f32", (1, 64), 8192), TensorDesc("bf16", (1, 16), 512, 0)],
        [("hidden_states", 0)],
        [("logits", 1)],
        [Instr("MatMul", (0, 0), 1, "lm", {"right_transpose": True, "eps": 0.5, "order": [2, 0]})],
        lmem_bytes=1 << 24,
        groups=[Group(0, 1, 0, 4096, [Instr("Load", (0,), 2, "x", {"axis": -1})])],
    )

    def s(text: str) -> bytes:
        return struct.pack("<H", len(text)) + text.encode()

    want = b"PRG2" + s("lm_head") + s("head") + struct.pack("<iQQ", -1, 128, 1 << 24)
    want += struct.pack("<I", 3)
    want += struct.pack("<BB2IQi", 2, 2, 1, 16, 4096, -1) + struct.pack("<BB2IQi", 0, 2, 1, 64, 8192, -1)
    want += struct.pack("<BB2IQi", 2, 2, 1, 16, 512, 0)  # a local tensor: lmem address 512, allocation 0
    want += struct.pack("<I", 1) + s("hidden_states") + struct.pack("<I", 0)
    want += struct.pack("<I", 1) + s("logits") + struct.pack("<I", 1)
    want += struct.pack("<I", 1) + struct.pack("<HB2II", 3, 2, 0, 0, 1) + s("lm") + struct.pack("<B", 3)
    # attributes in key order: eps (f64), order (i64 list), right_transpose (bool)
    want += s("eps") + struct.pack("<Bd", 1, 0.5)
    want += s("order") + struct.pack("<BI2q", 4, 2, 2, 0)
    want += s("right_transpose") + struct.pack("<B?", 2, True)
    # one group: index, rows, tile_rows, lmem peak, then its commands as instructions
    want += struct.pack("<I", 1) + struct.pack("<IIIQ", 0, 1, 0, 4096)
    want += struct.pack("<I", 1) + struct.pack("<HBII", 15, 1, 0, 2) + s("x") + struct.pack("<B", 1)
    want += s("axis") + struct.pack("<Bq", 0, -1)
    assert encode(prog) == want
    assert decode(want) == prog
    assert OPCODES == (
        "Gather", "RMSNorm", "MatMul", "Reshape", "Permute", "Rope", "FAttention",
        "Concat", "Add", "Mul", "Active", "Softmax", "Cast", "A16MatMul", "Load", "Store", "A16Gather",
        "LayerNorm", "Slice", "L2Norm", "CausalConv1d", "GatedDeltaRule",
    )  # fmt: skip


def test_decode_rejects_every_truncation(nets: dict[str, CompiledNet]) -> None:
    data = encode(nets["lm_head"].program)
    for n in range(len(data)):
        with pytest.raises(LlmbuildError):
            decode(data[:n])


def test_decode_rejects_bad_magic(nets: dict[str, CompiledNet]) -> None:
    data = encode(nets["lm_head"].program)
    with pytest.raises(LlmbuildError, match="bad magic"):
        decode(b"GORP" + data[4:])


def _with_last_instr(prog: Program, instr: Instr) -> bytes:
    return encode(dataclasses.replace(prog, instrs=[*prog.instrs, instr]))


def test_decode_rejects_a_truncated_final_string(nets: dict[str, CompiledNet]) -> None:
    prog = nets["lm_head"].program
    data = _with_last_instr(prog, Instr("Active", (0,), 1, "silu", {"mode": "SILU"}))
    truncated = [n for n in range(len(data) - 4, len(data)) if _decodes(data[:n])]
    assert truncated == []


def test_decode_rejects_unknown_opcodes(nets: dict[str, CompiledNet]) -> None:
    prog = nets["lm_head"].program
    data = encode(prog)
    # the first instruction's opcode sits right after the u32 instruction count
    count = struct.pack("<I", len(prog.instrs))
    first = struct.pack("<H", OPCODES.index(prog.instrs[0].op) + 1)
    pos = data.rindex(count + first, 0, data.index(prog.instrs[0].loc.encode())) + 4
    accepted = [
        code
        for code in (0, len(OPCODES) + 1, 0xFFFF)
        if _decodes(data[:pos] + struct.pack("<H", code) + data[pos + 2 :])
    ]
    assert accepted == []


def _decodes(data: bytes) -> bool:
    """True when `decode` accepts the bytes; an LlmbuildError is the one acceptable refusal."""
    try:
        decode(data)
    except LlmbuildError:
        return False
    except Exception:  # an IndexError etc. is a crash, not a diagnosis: count it as accepted garbage
        return True
    return True


# ---- the container --------------------------------------------------------------------------------


def sections() -> list[tuple[str, list[bytes]]]:
    return [
        ("meta", [b'{"format": "llmbuild"}']),
        ("weights", [bytes(range(256)) * 8, b"\x01\x02\x03"]),  # chunks are concatenated
        ("net:block_0", [b"PROG" + b"\xaa" * 100]),
        ("empty", []),
    ]


def test_container_reads_back_sections(tmp_path: Path) -> None:
    path = tmp_path / "out" / "m.llmb"  # the parent directory is created
    entries = write_container(path, sections())
    c = Container(path)
    assert c.names() == ["meta", "weights", "net:block_0", "empty"]
    for name, chunks in sections():
        assert bytes(c.section(name)) == b"".join(chunks)
        assert b"".join(c.chunks(name, size=7)) == b"".join(chunks)
    assert [dataclasses.astuple(e) for e in entries] == [dataclasses.astuple(c.entries[e.name]) for e in entries]
    assert c.entries["weights"].offset % container.PAGE_ALIGN == 0  # mmap-able weight image
    assert all(e.offset % container.SECTION_ALIGN == 0 for e in c.entries.values())
    with pytest.raises(LlmbuildError, match="missing section nope"):
        c.section("nope")


def test_file_spans_are_copied_and_hashed_as_their_bytes(tmp_path: Path, monkeypatch) -> None:
    """A section given as spans of files (the weight image's tensors, copied file to file and hashed
    through windows of a memory map) holds and digests exactly those bytes, also where a span starts off
    the map's granularity and crosses a window, and where copy_file_range is refused (read and write)."""
    source = tmp_path / "weights.bin"
    data = np.random.default_rng(3).integers(0, 256, 3 * mmap.ALLOCATIONGRANULARITY + 777, dtype=np.uint8).tobytes()
    source.write_bytes(data)
    monkeypatch.setattr(container, "_HASH_WINDOW", mmap.ALLOCATIONGRANULARITY)
    spans = [(5, 6), (100, 2 * mmap.ALLOCATIONGRANULARITY + 9), (0, 0), (len(data) - 300, len(data))]
    want = b"x" + b"".join(data[a:b] for a, b in spans) + b"\0" * 3

    def section() -> list:
        return [b"x", *(container.FileSpan(source, a, b) for a, b in spans), b"\0" * 3]

    def no_copy(*args: object) -> int:
        raise OSError(18, "Invalid cross-device link")

    for refuse in ("", "refused", "absent"):
        if refuse == "refused":
            monkeypatch.setattr(container.os, "copy_file_range", no_copy)
        elif refuse == "absent":  # not Linux
            monkeypatch.delattr(container.os, "copy_file_range")
        path = tmp_path / f"m{refuse}.llmb"
        write_container(path, [("meta", [b"{}"]), ("weights", section()), ("net:a", [b"PROG"])])
        c = Container(path)  # verifies every section's sha256
        assert bytes(c.section("weights")) == want and bytes(c.section("net:a")) == b"PROG"
        assert c.entries["weights"].sha256 == hashlib.sha256(want).digest()
    with pytest.raises(LlmbuildError, match="weights.bin: ends before byte"):
        write_container(tmp_path / "bad.llmb", [("weights", [container.FileSpan(source, 0, len(data) + 1)])])
    assert not (tmp_path / "bad.llmb").exists() and not (tmp_path / "bad.llmb.tmp").exists()


def test_container_layout_follows_the_documentation(tmp_path: Path) -> None:
    # An independent reader of docs/binary-format.md: 32-byte header, 112-byte entries at the end.
    path = tmp_path / "m.llmb"
    write_container(path, sections())
    data = path.read_bytes()
    magic, version, count, table, checksum = struct.unpack_from("<8sIIQQ", data, 0)
    assert (magic, version, count) == (b"LLMBUILD", 2, len(sections()))
    assert table + count * 112 == len(data)
    # the checksum: SHA-256 of the header with the field zero, then the table; its first 8 bytes
    expected = hashlib.sha256(struct.pack("<8sIIQQ", magic, version, count, table, 0) + data[table:]).digest()
    assert checksum == int.from_bytes(expected[:8], "little")
    for i, (name, chunks) in enumerate(sections()):
        raw, offset, size, sha = struct.unpack_from("<64sQQ32s", data, table + 112 * i)
        assert raw == name.encode().ljust(64, b"\0")
        assert data[offset : offset + size] == b"".join(chunks)
        assert sha == hashlib.sha256(b"".join(chunks)).digest()


def test_container_detects_a_flipped_byte(tmp_path: Path) -> None:
    path = tmp_path / "m.llmb"
    write_container(path, sections())
    offset = Container(path).entries["net:block_0"].offset + 50
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(LlmbuildError) as info:
        Container(path)
    message = str(info.value)
    assert "checksum mismatch" in message and "net:block_0" in message and str(path) in message
    assert "\n" not in message
    # without verification it opens, and an explicit verify() names the same section
    lazy = Container(path, verify=False)
    assert bytes(lazy.section("meta")) == b'{"format": "llmbuild"}'
    with pytest.raises(LlmbuildError, match="net:block_0"):
        lazy.verify()


@pytest.mark.parametrize("keep", [0, 10, 100, 0.5, -1])
def test_truncated_container_is_one_line_error(tmp_path: Path, keep: float) -> None:
    path = tmp_path / "m.llmb"
    write_container(path, sections())
    data = path.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else (keep if keep >= 0 else len(data) + keep)
    path.write_bytes(data[:n])
    with pytest.raises(LlmbuildError) as info:
        Container(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_bad_magic_and_version_are_one_line_errors(tmp_path: Path) -> None:
    path = tmp_path / "m.llmb"
    write_container(path, sections())
    data = path.read_bytes()
    path.write_bytes(b"NOTLLMBD" + data[8:])
    with pytest.raises(LlmbuildError, match="bad magic") as info:
        Container(path)
    assert "\n" not in str(info.value)
    path.write_bytes(data[:8] + struct.pack("<I", 99) + data[12:])
    with pytest.raises(LlmbuildError, match="version 99") as info:
        Container(path)
    assert "\n" not in str(info.value)
    with pytest.raises(LlmbuildError, match="cannot open"):
        Container(tmp_path / "absent.llmb")


@pytest.mark.parametrize("where", ["count", "table offset", "name", "offset", "size", "digest"])
def test_a_flipped_bit_in_the_header_or_table_is_one_line_error(tmp_path: Path, where: str) -> None:
    path = tmp_path / "m.llmb"
    write_container(path, sections())
    data = bytearray(path.read_bytes())
    table = struct.unpack_from("<Q", data, 16)[0]
    at = {"count": 12, "table offset": 16, "name": table + 112 + 3, "offset": table + 112 + 64,
          "size": table + 112 + 72, "digest": table + 112 + 90}[where]
    data[at] ^= 0x04
    path.write_bytes(bytes(data))
    with pytest.raises(LlmbuildError) as info:
        Container(path, verify=False)  # caught before any section is read
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    assert "corrupt" in message


def test_section_names_must_be_printable_even_when_signed(tmp_path: Path) -> None:
    # A hostile writer signs its own table: the names it uses still have to be printable UTF-8.
    path = tmp_path / "m.llmb"
    for raw in (b"net:\nblock", b"net:\x00x", b"\xff\xfe", b"net:\x1b[2J"):
        write_container(path, sections())
        data = bytearray(path.read_bytes())
        table = struct.unpack_from("<Q", data, 16)[0]
        data[table : table + 64] = raw.ljust(64, b"\0")
        count = struct.unpack_from("<I", data, 12)[0]
        digest = hashlib.sha256(struct.pack("<8sIIQQ", b"LLMBUILD", 2, count, table, 0) + bytes(data[table:]))
        struct.pack_into("<Q", data, 24, int.from_bytes(digest.digest()[:8], "little"))
        path.write_bytes(bytes(data))
        with pytest.raises(LlmbuildError, match="not a printable UTF-8 name") as info:
            Container(path, verify=False)
        assert "\n" not in str(info.value) and "\x00" not in str(info.value)


def test_failing_section_iterator_leaves_nothing_behind(tmp_path: Path) -> None:
    def chunks() -> Iterator[bytes]:
        yield b"x" * 1000
        raise RuntimeError("checkpoint read failed")

    path = tmp_path / "m.llmb"
    with pytest.raises(RuntimeError, match="checkpoint read failed"):
        write_container(path, [("meta", [b"{}"]), ("weights", chunks())])
    assert list(tmp_path.iterdir()) == []

    # and an existing good file is not replaced by a half-written one
    write_container(path, sections())
    before = path.read_bytes()
    with pytest.raises(RuntimeError):
        write_container(path, [("weights", chunks())])
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.llmb"]


def test_writing_is_deterministic(tmp_path: Path) -> None:
    a, b = tmp_path / "a.llmb", tmp_path / "b.llmb"
    write_container(a, sections())
    write_container(b, sections())
    assert a.read_bytes() == b.read_bytes()
    write_container(b, [*sections()[:-1], ("empty", [b"!"])])
    assert a.read_bytes() != b.read_bytes()  # the comparison can tell files apart


def test_long_section_names_are_kept_or_refused(tmp_path: Path) -> None:
    name = "net:" + "x" * 70
    try:
        write_container(tmp_path / "m.llmb", [(name, [b"abc"])])
    except (LlmbuildError, ValueError):
        return
    assert Container(tmp_path / "m.llmb").names() == [name]

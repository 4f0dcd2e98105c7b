"""A binary checked whole is not hashed again while it is unchanged; any write, a freshly written file and
a turned-off cache all hash every section."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from llmbuild import LlmbuildError
from llmbuild.binary import container, verified_stamp
from llmbuild.binary.container import Container, write_container


def _sections() -> list[tuple[str, list[bytes]]]:
    return [("meta", [b'{"format": "llmbuild"}']), ("weights", [bytes(range(256)) * 64])]


@pytest.fixture
def hashes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The files whose sections were hashed, in order (stamps kept under tmp_path)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(verified_stamp.ENV, raising=False)
    seen: list[Path] = []
    verify = container.Container.verify

    def counted(self: Container) -> None:
        seen.append(self.path)
        verify(self)

    monkeypatch.setattr(container.Container, "verify", counted)
    return seen


def _settled(path: Path) -> None:
    """Make the file look written long ago: its change time moves to now, so wait out the settling time."""
    old = time.time() - 60
    os.utime(path, (old, old))
    time.sleep(verified_stamp.SETTLE_S + 0.1)


def test_an_unchanged_settled_file_is_hashed_once(tmp_path: Path, hashes: list[Path],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verified_stamp, "SETTLE_S", 0.2)
    path = tmp_path / "m.llmb"
    write_container(path, _sections())
    _settled(path)
    Container(path).close()
    Container(path).close()
    assert hashes == [path]


def test_a_fresh_file_is_hashed_every_time(tmp_path: Path, hashes: list[Path]) -> None:
    path = tmp_path / "m.llmb"
    write_container(path, _sections())
    Container(path).close()
    Container(path).close()
    assert hashes == [path, path]  # written within SETTLE_S: its times cannot tell a later write apart


def test_a_write_after_the_stamp_is_caught(tmp_path: Path, hashes: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verified_stamp, "SETTLE_S", 0.2)
    path = tmp_path / "m.llmb"
    write_container(path, _sections())
    _settled(path)
    entry = Container(path).entries["weights"]
    data = bytearray(path.read_bytes())
    data[entry.offset + 7] ^= 0x01
    stat = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with its modification time set back
    with pytest.raises(LlmbuildError, match="checksum mismatch in section weights"):
        Container(path)


def test_turned_off_hashes_every_time(tmp_path: Path, hashes: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verified_stamp, "SETTLE_S", 0.2)
    monkeypatch.setenv(verified_stamp.ENV, "0")
    path = tmp_path / "m.llmb"
    write_container(path, _sections())
    _settled(path)
    Container(path).close()
    Container(path).close()
    assert hashes == [path, path]
    assert not (tmp_path / "cache" / "llmbuild").exists()

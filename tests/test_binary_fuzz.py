"""The loader trusts nothing: random corruptions of a real binary, raw and re-signed, end in one
LlmbuildError or a run, never another exception (a small budget here; benchmarks/fuzz_binary.py runs
100,000 cases)."""

from __future__ import annotations

from pathlib import Path

import pytest
from binary_mutations import (
    JSON_EDITS,
    JSON_SECTIONS,
    RAW_KINDS,
    json_mutation,
    load_and_run,
    raw_mutation,
    resigned_mutation,
    sections,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

RECIPE = "qwen2_tiny_f32"
SETTINGS = settings(max_examples=200, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class Binary(bytes):
    def __repr__(self) -> str:  # hypothesis prints its arguments on failure: not a megabyte of them
        return f"<{RECIPE}.llmb, {len(self)} bytes>"


@pytest.fixture(scope="module")
def binary(runtime_build: Path) -> bytes:
    return Binary((runtime_build / RECIPE / f"{RECIPE}.llmb").read_bytes())


def test_the_intact_binary_runs(binary: bytes, tmp_path: Path) -> None:
    path = tmp_path / "m.llmb"
    path.write_bytes(binary)
    assert load_and_run(path) == "ok"


@SETTINGS
@given(kind=st.sampled_from(RAW_KINDS), at=st.integers(0, 1 << 40), value=st.integers(0, 255),
       length=st.integers(1, 64))
def test_raw_corruption_is_an_llmbuild_error_or_harmless(binary: bytes, tmp_path: Path, kind: str, at: int, value: int,
                                              length: int) -> None:
    path = tmp_path / "m.llmb"
    mutated = raw_mutation(binary, kind, at, value, length)
    path.write_bytes(mutated)
    # "ok": the bytes changed are padding between sections, covered by no checksum and read by no one
    assert load_and_run(path) in ("ok", "LlmbuildError")


@SETTINGS
@given(data=st.data(), at=st.integers(0, 1 << 40), value=st.integers(0, 255), length=st.integers(0, 16))
def test_resigned_corruption_is_an_llmbuild_error_or_runs(binary: bytes, tmp_path: Path, data: st.DataObject,
                                                          at: int, value: int, length: int) -> None:
    names = [name for name, _, _ in sections(binary) if name != "weights"]
    section = data.draw(st.sampled_from(names))
    path = tmp_path / "m.llmb"
    path.write_bytes(resigned_mutation(binary, section, at, value, length))
    assert load_and_run(path) in ("ok", "LlmbuildError")


@SETTINGS
@given(section=st.sampled_from(JSON_SECTIONS), edit=st.sampled_from(JSON_EDITS), at=st.integers(0, 1 << 30),
       other=st.integers(0, 1 << 30), value=st.integers(0, 255))
def test_an_edited_json_field_is_an_llmbuild_error_or_runs(binary: bytes, tmp_path: Path, section: str, edit: str,
                                                           at: int, other: int, value: int) -> None:
    """One field of meta or plan given a wrong type, an out-of-range value, another field's value, dropped or
    swapped, and the binary re-signed: the loader names the field or runs."""
    path = tmp_path / "m.llmb"
    path.write_bytes(json_mutation(binary, section, edit, at, other, value))
    assert load_and_run(path) in ("ok", "LlmbuildError")

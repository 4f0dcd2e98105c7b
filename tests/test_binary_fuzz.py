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


# The long run's findings (benchmarks/fuzz_binary.py, docs/performance.md): plan slots of 2^31 elements
# (terabyte allocations), a 300-character chip name opened as a file, plan edits that ran for minutes.
FOUND = [("meta", "type", 110996300, 972846411, 73), ("plan", "alias", 167457534, 410933088, 75),
         ("plan", "alias", 244785126, 89030460, 233), ("plan", "alias", 672862574, 283043376, 122),
         ("plan", "bound", 191052086, 927541392, 106), ("plan", "bound", 96906350, 343689842, 246),
         ("plan", "bound", 980079806, 202804695, 106), ("plan", "swap", 693989534, 837212831, 226),
         ("plan", "type", 118257049, 848107233, 66), ("plan", "type", 328311025, 679192611, 26),
         ("plan", "type", 472249953, 504225606, 186), ("plan", "type", 534276518, 188410191, 246)]


@pytest.mark.parametrize("case", FOUND, ids=lambda c: "-".join(map(str, c[:3])))
def test_what_the_long_run_found_is_one_llmbuild_error(binary: bytes, tmp_path: Path, case: tuple) -> None:
    path = tmp_path / "m.llmb"
    path.write_bytes(json_mutation(binary, *case))
    # (a crash propagates out of load_and_run; "ok" only if a later change of meta moved the seed's field)
    assert load_and_run(path) in ("ok", "LlmbuildError")

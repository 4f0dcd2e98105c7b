"""docs/performance.md is written from the benchmark records alone: regenerating it from the committed records
gives the committed file byte for byte, a stale doc is named by its section, and a malformed record is one
line naming its file and field."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "benchmarks" / "records"
sys.path.insert(0, str(ROOT / "benchmarks"))

import performance_doc  # noqa: E402
import records  # noqa: E402


def _generator(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "performance_doc.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_the_committed_doc_is_what_the_records_give():
    expected = performance_doc.render(records.load_records(RECORDS))
    assert (ROOT / "docs" / "performance.md").read_text() == expected, (
        "docs/performance.md differs from its records: run python benchmarks/performance_doc.py")
    assert _generator("--check").returncode == 0


def test_every_record_is_in_the_doc_with_its_command_and_machine():
    doc = (ROOT / "docs" / "performance.md").read_text()
    loaded = records.load_records(RECORDS)
    assert loaded
    for record in loaded:
        assert f"benchmarks/records/{record.name}.json" in doc
        assert record.command in doc


def test_a_stale_doc_is_named_by_its_section(tmp_path):
    doc = tmp_path / "performance.md"
    text = performance_doc.render(records.load_records(RECORDS))
    doc.write_text(text.replace("## Cost model", "## Cost model\n\nan edit by hand", 1))
    result = _generator("--check", "--doc", str(doc))
    assert result.returncode == 1
    assert "stale from section 'Cost model'" in result.stderr


def _broken(tmp_path: Path, change) -> subprocess.CompletedProcess:
    folder = tmp_path / "records"
    shutil.copytree(RECORDS, folder)
    path = folder / "fuzz_binary.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return _generator("--records", str(folder), "--doc", str(tmp_path / "out.md"))


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d.pop("command"), "'command'"),
    (lambda d: d.update(date="4 Dec 2026"), "'date'"),
    (lambda d: d["rows"][1].pop(), "'rows[1]'"),
    (lambda d: d.update(section="elsewhere"), "'section'"),
    (lambda d: d["machine"].pop("cores"), "'machine.cores'"),
    (lambda d: d.update(command="python benchmarks/fuzz_binary.py --build-dir /work/build"), "'command'"),
    (lambda d: d.update(colour="red"), "'colour'"),
])
def test_a_malformed_record_is_one_line_naming_the_file_and_field(tmp_path, change, field):
    result = _broken(tmp_path, change)
    assert result.returncode == 2
    message = result.stderr.strip()
    assert "\n" not in message
    assert "fuzz_binary.json" in message and field in message
    assert not (tmp_path / "out.md").exists()


def test_a_record_written_by_a_benchmark_reads_back(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "x.py"), "--out", str(ROOT / "build" / "x")])
    path = tmp_path / "x.json"
    written = records.write_record(path, name="x", section="cost model", title="t", caption="c",
                                   columns=["a", "b"], rows=[["one", 1.5], ["two", None]])
    assert written.command == "python benchmarks/x.py --out build/x"
    assert {"cpu", "cores", "memory_gib"} <= set(written.machine)
    assert records.load_record(path) == written
    assert "| one | 1.5 |" in performance_doc.render([written])


def test_links_into_the_doc_name_its_sections():
    doc = (ROOT / "docs" / "performance.md").read_text()
    anchors = {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
               for line in doc.splitlines() if line.startswith("#")}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for anchor in re.findall(r"performance\.md#([\w-]+)", path.read_text()):
            assert anchor in anchors, f"{path.name}: performance.md#{anchor} names no section"

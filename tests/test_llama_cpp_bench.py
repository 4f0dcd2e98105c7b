"""The host-speed benchmarks' llama.cpp helpers: which checkpoints its converter reads, when a GGUF is made
again, and the one-line note when llama-cpp-python is absent (CI never installs it)."""

from __future__ import annotations

import json
import os
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import llama_cpp_gguf  # noqa: E402


def _checkpoint(tmp_path: Path, quant: dict | None) -> Path:
    fields: dict = {"model_type": "qwen2"}
    if quant is not None:
        fields["quantization_config"] = quant
    (tmp_path / "config.json").write_text(json.dumps(fields), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(("quant", "readable"), [
    (None, True),
    ({"quant_method": "gptq", "bits": 4}, True),
    ({"quant_method": "gptq", "bits": 8}, True),
    ({"quant_method": "gptq", "bits": 3}, False),
    ({"quant_method": "awq", "bits": 4}, False),
])
def test_converter_reads(tmp_path: Path, quant: dict | None, readable: bool) -> None:
    why = llama_cpp_gguf.converter_reads(_checkpoint(tmp_path, quant))
    assert (why is None) == readable
    if not readable:
        assert quant is not None and quant["quant_method"] in why


def test_fresh_follows_the_newest_source_file(tmp_path: Path) -> None:
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"x")
    out = tmp_path / "bf16.gguf"
    assert not llama_cpp_gguf.fresh(out, source)
    out.write_bytes(b"gguf")
    os.utime(source / "model.safetensors", (1_000, 1_000))
    assert llama_cpp_gguf.fresh(out, source)
    os.utime(source / "model.safetensors", (out.stat().st_mtime + 10,) * 2)
    assert not llama_cpp_gguf.fresh(out, source)


def test_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(llama_cpp_gguf.metadata, "version", absent)
    note = llama_cpp_gguf.missing()
    assert note is not None and "\n" not in note
    assert "not installed" in note and "benchmarks/llama_cpp/setup.sh" in note
    monkeypatch.setattr(llama_cpp_gguf.metadata, "version", lambda name: "0.0.1")
    note = llama_cpp_gguf.missing()
    assert note is not None and "0.0.1" in note and llama_cpp_gguf.VERSION in note


def test_quantize_names_the_kinds() -> None:
    with pytest.raises(ValueError, match="q4_0"):
        llama_cpp_gguf.quantize(Path("in.gguf"), Path("out.gguf"), "q3_k")

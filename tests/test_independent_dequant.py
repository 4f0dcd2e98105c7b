"""The quantized tensors a build imports, read again by code llmbuild did not write (gptqmodel's and
AutoAWQ's own dequantization, the gguf package's), beside llmbuild's reader, which the compiler and the
reference share: a reader bug that both sides inherit fails verification, naming the tensor."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import ROOT, snakemake

from llmbuild.quant.checkpoint import QuantizedCheckpoint
from llmbuild.verify.independent_dequant import _quantized

FIXTURES = ROOT / "tests" / "fixtures" / "quant"
NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file())
# The writing libraries the test environment installs (scripts/install.sh); compressed-tensors is not one.
INDEPENDENT = {"gptq": "gptqmodel", "awq": "awq"}

# llmbuild's own unpacking with the nibble order swapped (the two 4-bit values of each byte exchanged):
# injected into every process of a build through sitecustomize, so the compiler and the reference both
# read the checkpoint wrongly, and agree with each other.
SWAPPED_NIBBLES = """
import llmbuild.quant.readers as readers

_unpack = readers.unpack_along_cols


def _swapped(words, bits, order=None):
    out = _unpack(words, bits, order)
    if bits == 4:  # the two values of each byte exchanged
        out = out.reshape(out.shape[0], -1, 2)[:, :, ::-1].reshape(out.shape).copy()
    return out


readers.unpack_along_cols = _swapped
"""


@pytest.mark.parametrize("block", [None, 8])
@pytest.mark.parametrize("name", NAMES)
def test_every_fixture_reads_as_its_library_reads_it(name: str, block: int | None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole, and with the library called on blocks of 8 output columns (how a real-size projection is read,
    in blocks of 2048: the fixtures' projections are narrower than one)."""
    import llmbuild.verify.independent_dequant as independent

    if block is not None:
        monkeypatch.setattr(independent, "COLUMN_BLOCK", block)
    ckpt = QuantizedCheckpoint(FIXTURES / name)
    result = _quantized(ckpt, [0])
    module = INDEPENDENT.get(ckpt.info.layout)
    if module is None or importlib.util.find_spec(module) is None:
        assert result["equal"] is None and result["why"].startswith("no independent implementation"), result
        return
    assert result["equal"] is True and result["max_abs_difference"] == 0.0, result
    assert len(result["tensors"]) == 7 and result["library"].split()[0] in ("gptqmodel", "autoawq"), result


def test_a_swapped_nibble_order_is_found_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gptqmodel")
    import llmbuild.quant.readers as readers

    # Recorded first, so that the teardown puts the real reader back: the text patches the module itself.
    monkeypatch.setattr(readers, "unpack_along_cols", readers.unpack_along_cols)
    exec(SWAPPED_NIBBLES, {})  # noqa: S102  (the test's own bug, the same text the build gets)
    assert readers.unpack_along_cols.__name__ == "_swapped"
    result = _quantized(QuantizedCheckpoint(FIXTURES / "gptq_sym_g32"), [0])
    assert result["equal"] is False and result["first_differing"] == "model.layers.0.self_attn.q_proj", result


def test_a_build_whose_reader_both_sides_share_is_wrong_fails_verification(tmp_path: Path) -> None:
    """The whole build with the bug in every process: its checks pass (compiler and reference read the same
    wrong levels), and verification fails on the independent reading alone, naming the tensor."""
    pytest.importorskip("gptqmodel")
    fixture = tmp_path / "gptq_sym_g32"
    shutil.copytree(FIXTURES / "gptq_sym_g32", fixture)
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "gptq_fixture.yaml").write_text(
        f"description: the gptqmodel fixture\narchitecture: qwen2\nsource: {{kind: hf, path: {fixture}}}\n"
        "quantization: {mode: auto}\nstages: {seq_length: 64, prefill_length: 16}\n"
        "verify: {prompt_ids: [1, 5, 9, 42], max_new_tokens: 4, exact_tokens: false}\n")
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(SWAPPED_NIBBLES)
    build = tmp_path / "build"
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(inject) + (os.pathsep + old if old else "")
    try:
        result = snakemake(build, "gptq_fixture", recipes=recipes, check=False)
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old
    assert result.returncode != 0
    failed = json.loads((build / "gptq_fixture" / "verify.failed.json").read_text())
    assert failed["failures"] == [
        f"independent dequantization: model.layers.0.self_attn.q_proj as llmbuild reads it differs from "
        f"{failed['independent_dequantization']['library']} (max abs difference "
        f"{json.loads((build / 'gptq_fixture' / 'dequant_check.json').read_text())['max_abs_difference']}): the "
        "compiler and the reference share that reading"], failed["failures"]


def test_the_reader_is_itself_again_after_the_injected_bug() -> None:
    """The previous test's bug does not outlive it (later tests of the process read checkpoints)."""
    import llmbuild.quant.readers as readers

    assert readers.unpack_along_cols.__name__ == "unpack_along_cols"


def test_nothing_read_is_not_called_equal() -> None:
    """Layers the checkpoint does not have: no tensor compared, so no claim either way."""
    pytest.importorskip("gptqmodel")
    result = _quantized(QuantizedCheckpoint(FIXTURES / "gptq_sym_g32"), [7])
    assert result["equal"] is None and result["tensors"] == [] and result["why"].startswith("no quantized tensor")

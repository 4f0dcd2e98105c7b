"""The vendor-bmodel runner on the vendor's cmodel (llmbuild/runtime/bmodel_cmodel.py, bmodel_generate.py).

The pure-numpy parts (bfloat16 rounding, the mask values, the bmodel header) always run. The rest needs the
TPU-MLIR package's `lib/` (LLMBUILD_TPUMLIR_LIB, or TPUC_ROOT/lib) and LLM bmodels to run, from either
- LLMBUILD_TEST_BMODEL (one or more paths, separated by os.pathsep) with LLMBUILD_TEST_HF (the checkpoint
  they were built from), or
- LLMBUILD_TEST_LLM_CONVERT_ENV: a shell script to source that puts the vendor's `llm_convert` on PATH; a
  tiny random Qwen2 is then made here (fixed seed, saved in bf16) and converted to bf16 bmodels for the
  chips in LLMBUILD_TEST_CHIPS (default "bm1684x,bm1688"; ~10 s each).
The incumbent's env defaults to LLMBUILD_INCUMBENT or `.venv/incumbent/env.sh` (what `.ci/run` sets up).
llmbuild's own bmodels of its tiny Qwen2 run too (`llmbuild:CHIP[:history]` cases: built by the workflow,
the history form's `block_kv_i` carrying the second turn).

Every cmodel run is a subprocess (`python -m llmbuild.runtime.bmodel_generate`): a process can hold only one
chip's simulator, and a stuck simulator then fails one test by timeout instead of hanging the session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from llmbuild.runtime.bmodel_cmodel import (
    CmodelError,
    CmodelRuntime,
    bf16_bits_to_f32,
    bmodel_chip,
    f32_to_bf16_bits,
    find_toolchain_lib,
)
from llmbuild.runtime.bmodel_generate import MASK_BITS, MASK_VALUE
from llmbuild.runtime.cmodel_yield import preload_env

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79]
SECOND_TURN = [26, 53, 58, 97]
NEW_TOKENS = 8
# Where transformers' top-2 logit gap is below this, the chip may pick the other token: bf16 arithmetic moves
# this tiny model's logits by up to ~0.01 (transformers in bf16 vs f32 on the same checkpoint), and the
# chip's kernels round differently again.
GAP_TOL = 0.03
# llmbuild's tiny Qwen2 (hidden 64) in f16: transformers' own f16 run moves its turn-2 top-2 gap at step 3
# from 0.107 (f32) to 0.008, so 16-bit arithmetic decides ties up to about that size.
GAP_TOL_TINY_F16 = 0.15
RUN_TIMEOUT_S = 600

# ----------------------------------------------------------------------------------------------------------
# Always: the numerics and the file format


def test_bf16_rounds_to_nearest_even() -> None:
    cases = {
        0x3F800000: 0x3F80,  # 1.0
        0x3F808000: 0x3F80,  # halfway, even below: stays
        0x3F818000: 0x3F82,  # halfway, odd below: up
        0x3F808001: 0x3F81,  # just above halfway: up
        0x3F807FFF: 0x3F80,  # just below halfway: down
        0xBF818000: 0xBF82,  # negative halfway, odd: away from zero
        0x7F7FFFFF: 0x7F80,  # the largest float rounds to infinity
        0x7F800000: 0x7F80,  # +inf
        0xFF800000: 0xFF80,  # -inf
        0x00000001: 0x0000,  # the smallest subnormal rounds to zero
    }
    src = np.array(list(cases), dtype=np.uint32).view(np.float32)
    got = f32_to_bf16_bits(src)
    assert [hex(v) for v in got] == [hex(v) for v in cases.values()]
    nan = f32_to_bf16_bits(np.array([np.nan, -np.nan], np.float32))
    assert np.isnan(bf16_bits_to_f32(nan)).all()


def test_bf16_round_trip_is_exact_for_every_value() -> None:
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = bf16_bits_to_f32(bits)
    finite = ~np.isnan(values)
    assert (f32_to_bf16_bits(values)[finite] == bits[finite]).all()


def test_mask_values_are_chat_cpp_bits() -> None:
    """chat.cpp writes 0xC61C (bf16) / 0xF0E2 (f16) into the mask: the float values here encode to exactly those."""
    assert int(f32_to_bf16_bits(np.float32([MASK_VALUE["bfloat16"]]))[0]) == MASK_BITS["bfloat16"] == 0xC61C
    assert int(np.float16(MASK_VALUE["float16"]).view(np.uint16)) == MASK_BITS["float16"] == 0xF0E2


def test_bmodel_chip_reads_the_header(tmp_path: Path) -> None:
    fb = b"\0" * 40 + (7).to_bytes(4, "little") + b"BM1684X\0" + b"\0" * 20
    header = (0xFF55AAEE).to_bytes(4, "little") + (64).to_bytes(4, "little") + len(fb).to_bytes(4, "little")
    good = tmp_path / "a.bmodel"
    good.write_bytes(header + b"\0" * (64 - len(header)) + fb)
    assert bmodel_chip(good) == "bm1684x"
    bad = tmp_path / "b.bmodel"
    bad.write_bytes(b"not a bmodel at all")
    assert bmodel_chip(bad) is None


def test_runtime_refuses_a_wrong_lib_dir_or_chip(tmp_path: Path) -> None:
    with pytest.raises(CmodelError, match="no libbmrt.so"):
        CmodelRuntime(tmp_path, "bm1684x")
    with pytest.raises(CmodelError, match="unknown chip"):
        CmodelRuntime(tmp_path, "bm1690")


# ----------------------------------------------------------------------------------------------------------
# With the toolchain: bmodels on the cmodel against transformers

def _toolchain_lib() -> Path | None:
    from llmbuild.vendor_toolchain import ToolchainError, locate

    found = find_toolchain_lib()
    if found is not None:
        return found
    try:
        return locate().lib
    except ToolchainError:
        return None


LIB = _toolchain_lib()
ROOT = Path(__file__).resolve().parent.parent
_INCUMBENT = os.environ.get("LLMBUILD_TEST_LLM_CONVERT_ENV") or os.environ.get("LLMBUILD_INCUMBENT") or (
    str(ROOT / ".venv" / "incumbent" / "env.sh") if (ROOT / ".venv" / "incumbent" / "env.sh").is_file() else "")
# llmbuild's own bmodels: (chip, history form)
LLMBUILD_CASES = ("llmbuild:bm1684x:history", "llmbuild:bm1688:static")
needs_lib = pytest.mark.skipif(LIB is None, reason="no TPU-MLIR lib/ (set LLMBUILD_TPUMLIR_LIB to the package's "
                                                   "lib/ directory holding libbmrt.so and libcmodel_<chip>.so)")


def make_tiny_qwen2(out: Path) -> Path:
    """A random tiny Qwen2 (the vendor-proven shape: hidden 256, 4/2 heads of 64, 2 layers), fixed seed, bf16."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(
        vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rope_theta=1e6, rms_norm_eps=1e-6,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)
    transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    return out


def _llm_convert(env_script: str, hf: Path, chip: str, out: Path) -> Path:
    cmd = f'source "{env_script}" && llm_convert -m "{hf}" -s 128 -q bf16 -c {chip} -o "{out}"'
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=900, cwd=out.parent)
    found = sorted(out.glob("*.bmodel"))
    if proc.returncode != 0 or not found:
        pytest.fail(f"llm_convert for {chip} failed (rc {proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return found[0]


def _cases() -> list[tuple[str, str]]:
    """(bmodel, hf_dir) pairs, or a single ("", reason) placeholder when there are none."""
    paths = [p for p in os.environ.get("LLMBUILD_TEST_BMODEL", "").split(os.pathsep) if p]
    if paths:
        return [(p, os.environ.get("LLMBUILD_TEST_HF", "")) for p in paths]
    cases = [(c, "") for c in LLMBUILD_CASES]
    if _INCUMBENT:
        chips = os.environ.get("LLMBUILD_TEST_CHIPS", "bm1684x,bm1688").split(",")
        cases += [(f"llm_convert:{c.strip()}", "") for c in chips if c.strip()]
    return cases


@pytest.fixture(scope="session")
def made_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_qwen2(tmp_path_factory.mktemp("bmodel_cmodel") / "tiny-qwen2")


def _params() -> list:
    """The cases, llm_convert's BM1688 bmodel marked `longer`: its BM1684X one holds the same claim."""
    return [pytest.param(c, marks=pytest.mark.longer("tests/test_bmodel_cmodel.py[llm_convert:bm1684x]"))
            if c[0] == "llm_convert:bm1688" else c for c in _cases()]


@pytest.fixture(scope="session", params=_params() or [pytest.param(None, marks=pytest.mark.skip(
    reason="no bmodel to run: set LLMBUILD_TEST_BMODEL and LLMBUILD_TEST_HF, or LLMBUILD_TEST_LLM_CONVERT_ENV"))],
    ids=lambda c: Path(c[0]).name if c else "none")
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(bmodel, hf checkpoint, chip)."""
    if LIB is None:
        pytest.skip("no TPU-MLIR lib/ (set LLMBUILD_TPUMLIR_LIB)")
    spec, hf = request.param
    if spec.startswith("llm_convert:"):
        chip = spec.split(":", 1)[1]
        ckpt = request.getfixturevalue("made_checkpoint")
        bmodel = _llm_convert(_INCUMBENT, ckpt, chip, tmp_path_factory.mktemp(f"llm_convert_{chip}") / "out")
        return bmodel, ckpt, chip
    if spec.startswith("llmbuild:"):
        _, chip, form = spec.split(":")
        return _llmbuild_bmodel(tmp_path_factory.mktemp(f"llmbuild_{chip}_{form}"), chip, form == "history")
    if not hf or not Path(hf, "config.json").is_file():
        pytest.skip("LLMBUILD_TEST_HF must name the checkpoint LLMBUILD_TEST_BMODEL was built from")
    chip = bmodel_chip(spec)
    if chip is None:
        pytest.fail(f"{spec}: not a bmodel for a chip the cmodel runner supports")
    return Path(spec), Path(hf), chip


def _llmbuild_bmodel(tmp: Path, chip: str, history: bool) -> tuple[Path, Path, str]:
    """llmbuild's tiny Qwen2 in f16 for `chip` (and in the history form), built by the workflow. f16, not bf16:
    this model's hidden size is 64, and bf16's rounding moves its logits by more than GAP_TOL."""
    import shutil

    from helpers import snakemake

    recipes = tmp / "recipes"
    shutil.copytree(ROOT / "recipes", recipes)
    name = f"qwen2_tiny_f16_{chip}"
    (recipes / f"{name}.yaml").write_text(
        f"base: qwen2_tiny_f32\nquantization:\n  mode: f16\nverify:\n  exact_tokens: false\ntarget:\n  chip: {chip}\n"
        f"bmodel:\n  history: {'true' if history else 'false'}\n")
    build = tmp / "build"
    snakemake(build, f"{build}/{name}/{name}.bmodel", "--config", "bmodel=true", recipes=recipes)
    return build / name / f"{name}.bmodel", build / name / "checkpoint", chip


def run_cmodel(bmodel: Path, tmp: Path, *args: str) -> dict:
    """The runner's command line in a subprocess; its JSON report."""
    report = tmp / "report.json"
    cmd = [sys.executable, "-m", "llmbuild.runtime.bmodel_generate", str(bmodel), "--lib", str(LIB),
           "--json", str(report), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=preload_env())
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}\n{proc.stdout[-3000:]}"
    return json.loads(report.read_text())


def hf_greedy(hf: Path, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """transformers' greedy `generate` on the checkpoint in float32 compute; the tokens and each step's top-2
    logit gap."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    gen = transformers.GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None,
                                        pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), generation_config=gen)
    tokens = out.sequences[0, len(ids):].tolist()
    gaps = []
    for step in out.logits:
        top = torch.topk(step[0].float(), 2).values
        gaps.append(float(top[0] - top[1]))
    return tokens, gaps


def assert_greedy_agrees(got: list[int], ref: list[int], gaps: list[float], what: str,
                         tol: float = GAP_TOL) -> int:
    """Equal up to the first step where transformers' top-2 gap is below GAP_TOL (after a legitimate
    divergence the contexts differ, so nothing later is compared). Returns the agreeing prefix length."""
    for i, (a, b) in enumerate(zip(got, ref, strict=False)):
        if a != b:
            assert gaps[i] < tol, (f"{what}: token {i} is {a} on the cmodel, {b} in transformers, whose top-2 "
                                   f"gap there is {gaps[i]:.4f} (>= {tol}); cmodel {got}, transformers "
                                       f"{ref}, gaps {[round(g, 4) for g in gaps]}")
            print(f"{what}: diverges at token {i}, where transformers' top-2 gap is {gaps[i]:.4f}")
            return i
    assert len(got) == len(ref), f"{what}: {len(got)} tokens from the cmodel, {len(ref)} from transformers"
    print(f"{what}: {len(got)}/{len(ref)} tokens agree; smallest top-2 gap {min(gaps):.4f}")
    return len(got)


@needs_lib
def test_greedy_and_second_turn_match_transformers(case: tuple[Path, Path, str], tmp_path: Path) -> None:
    bmodel, hf, chip = case
    tol = GAP_TOL_TINY_F16 if bmodel.name.startswith("qwen2_tiny_f16") else GAP_TOL
    report = run_cmodel(bmodel, tmp_path, "--chip", chip, "--prompt", ",".join(map(str, PROMPT)),
                        "--turn", ",".join(map(str, SECOND_TURN)), "--max-new-tokens", str(NEW_TOKENS))
    first, second = (t["tokens"] for t in report["turns"])
    ref, gaps = hf_greedy(hf, PROMPT, NEW_TOKENS)
    agreed = assert_greedy_agrees(first, ref, gaps, f"{chip} turn 1", tol)
    if agreed == NEW_TOKENS:  # the second turn continues a conversation both sides agree on
        ref2, gaps2 = hf_greedy(hf, PROMPT + first + SECOND_TURN, NEW_TOKENS)
        how = "block_kv" if report["sizes"]["history_kv"] else "re-prefill"
        assert_greedy_agrees(second, ref2, gaps2, f"{chip} turn 2 ({how})", tol)
    assert report["conversation"][: len(PROMPT)] == PROMPT
    print(f"{chip} per-net launch seconds (median):",
          {n: round(v["median"], 3) for n, v in report["launch_seconds"].items()})


VALIDATION_SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    from llmbuild.runtime.bmodel_cmodel import CmodelRuntime, CmodelError
    lib, chip, bmodel = sys.argv[1:4]
    with CmodelRuntime(lib, chip) as rt:
        rt.load(bmodel)
        info = rt.net_info("embedding_cache")
        assert info.input_names == ("input_ids",) and info.inputs[0].dtype == "int32", info
        tries = {
            "shape": lambda: rt.launch("embedding_cache", [np.zeros((1, 2), np.int32)]),
            "dtype": lambda: rt.launch("embedding_cache", [np.zeros((1, 1), np.float32)]),
            "count": lambda: rt.launch("embedding_cache", []),
            "stage": lambda: rt.launch("embedding_cache", [np.zeros((1, 1), np.int32)], stage=5),
            "name": lambda: rt.net_info("no_such_net"),
        }
        for what, fn in tries.items():
            try:
                fn()
            except CmodelError as exc:
                msg = str(exc)
                assert "\\n" not in msg and ("embedding_cache" in msg or "no_such_net" in msg), msg
                print("refused", what, "|", msg)
            else:
                raise SystemExit(f"{what}: not refused")
        out = rt.launch("embedding_cache", [np.array([[5]], np.int64)])[0]  # exact ints are converted
        assert out.dtype == np.float32 and out.shape == info.outputs[0].shapes[0], out.shape
        assert rt.simulator is not None and rt.simulator.name == f"libcmodel_{chip}.so", rt.simulator
    other = {"bm1684x": "bm1688", "bm1688": "bm1684x"}[chip]
    try:
        CmodelRuntime(lib, other)
    except CmodelError as exc:
        print("refused second chip |", exc)
    else:
        raise SystemExit("a second chip in one process was not refused")
""")


@needs_lib
def test_launch_validates_before_the_c_library(case: tuple[Path, Path, str]) -> None:
    bmodel, _, chip = case
    proc = subprocess.run([sys.executable, "-c", VALIDATION_SCRIPT, str(LIB), chip, str(bmodel)],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert proc.stdout.count("refused ") == 6, proc.stdout[-3000:]


OTHER_CHIP_SCRIPT = textwrap.dedent("""
    import sys
    from llmbuild.runtime.bmodel_cmodel import CmodelRuntime, CmodelError
    lib, chip, bmodel = sys.argv[1:4]
    with CmodelRuntime(lib, chip) as rt:
        print("simulator", rt.simulator.name, flush=True)
        try:
            rt.load(bmodel)
        except CmodelError as exc:
            print("header check |", exc, flush=True)
        try:
            rt.load(bmodel, check_chip=False)
        except CmodelError as exc:
            print("runtime check |", exc, flush=True)
""")


@needs_lib
def test_the_other_chips_cmodel_refuses_the_bmodel(case: tuple[Path, Path, str]) -> None:
    """The private libcmodel.so symlink really selects the simulator: that simulator is the one mapped, and
    the runtime on it rejects the other chip's bmodel by itself (its log: "runtime arch[...] is not the same
    with bmodel arch[...]"), besides the header check that names both chips first."""
    bmodel, _, chip = case
    other = {"bm1684x": "bm1688", "bm1688": "bm1684x"}[chip]
    proc = subprocess.run([sys.executable, "-c", OTHER_CHIP_SCRIPT, str(LIB), other, str(bmodel)],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert f"simulator libcmodel_{other}.so" in out
    assert f"a bmodel for {chip}; this runtime simulates {other}" in out
    assert "bmrt_load_bmodel failed" in out and f"runtime arch[{other.upper()}]" in out, out[-3000:]

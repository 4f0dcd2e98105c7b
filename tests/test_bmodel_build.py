"""The vendor's bmodel as the build makes it: one Snakemake job per net, the staged combine, the checks on
the vendor's cmodel in verify.json, reruns per net, byte-identical rebuilds, and the one-line errors of a
missing or failing toolchain. Needs TPU-MLIR's tools (scripts/install.sh installs them)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, equal_but_unset_bytes, llmbuild, planned_jobs, snakemake

from llmbuild.runtime.cmodel_yield import preload_env
from llmbuild.vendor_toolchain import ToolchainError, locate
from llmbuild.verify.bmodel_checks import COVERAGE_AT_REAL_SIZE

try:
    locate()
    HAVE_TOOLCHAIN = True
except ToolchainError as exc:
    HAVE_TOOLCHAIN, WHY = False, str(exc)

pytestmark = pytest.mark.skipif(not HAVE_TOOLCHAIN, reason="TPU-MLIR is not installed (scripts/install.sh)")

BMODEL = ("--config", "bmodel=true")


def recipes_with(tmp_path: Path, **extra: str) -> Path:
    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", recipes)
    for name, text in extra.items():
        (recipes / f"{name}.yaml").write_text(text)
    return recipes


def test_tiny_bf16_bmodel_is_built_checked_on_the_cmodel_and_verified(build_root):
    snakemake(build_root, "qwen2_tiny_bf16", *BMODEL)
    build = build_root / "qwen2_tiny_bf16"
    verdict = json.loads((build / "verify.json").read_text())
    assert verdict["passed"] and verdict["bmodel"]["coverage"] == "every net"
    checks = json.loads((build / "bmodel.json").read_text())
    assert set(checks["nets"]) == {f"block_{i}" for i in range(4)} | {f"block_cache_{i}" for i in range(4)} | {
        "embedding", "embedding_cache", "lm_head"}
    assert checks["nets"]["lm_head"]["token"] == checks["nets"]["lm_head"]["reference_token"]
    e2e = checks["end_to_end"]
    assert e2e["ids"][:2] == e2e["reference_ids"][:2]
    # the per-net bmodels were read by their combine and deleted: the binary, its layers and its head stay
    kept = sorted(str(p.relative_to(build)) for p in build.rglob("*.bmodel"))
    assert kept == ["bmodel/head.bmodel", *(f"bmodel/layers/{i}.bmodel" for i in range(4)), "qwen2_tiny_bf16.bmodel"]
    size = sum(p.stat().st_size for p in (build / "bmodel").rglob("*.bmodel"))
    assert size <= 1.1 * (build / "qwen2_tiny_bf16.bmodel").stat().st_size + 5 * (6 << 20)  # + a kernel module each
    assert (build / "bmodel" / "nets" / "block_0" / "block_0.mlir").is_file()  # the vendor module, to read

    # The cmodel's polling engines yielded (runtime/cmodel_yield.py): run without it, every net and the
    # generation give the same numbers
    assert checks["engines_yield"] is True
    again = llmbuild(build_root, "bmodel-check", "qwen2_tiny_bf16",
                     env={"LLMBUILD_BMODEL": "1", "LLMBUILD_CMODEL_YIELD": "0"})
    assert again.returncode == 0, again.stderr
    plain = json.loads((build / "bmodel.json").read_text())
    assert plain["engines_yield"] is False
    untimed = [{k: v for k, v in run["end_to_end"].items() if k != "seconds"} for run in (plain, checks)]
    assert plain["nets"] == checks["nets"] and untimed[0] == untimed[1]


@pytest.mark.parametrize("mode", ["BF16", "F16"])
@pytest.mark.parametrize("net", ["lm_head", "embedding"])
def test_a_table_declared_in_16_bits_compiles_to_the_bmodel_of_its_float32_declaration(tmp_path, net, mode):
    """The head's vocabulary tables are declared in the net's 16-bit type (rounded by llmbuild) instead of
    float32 (rounded by TPU-MLIR's lowering), which keeps a 7B's lm_head lowering at 1.1 GB instead of 6.4:
    the bmodel must be the same bytes, rounding ties and the extremes of the range included."""
    from dataclasses import replace

    import numpy as np

    from llmbuild.bmodel.top_export import export_net
    from llmbuild.bmodel.vendor_compile import NetOptions, compile_net
    from llmbuild.frontend.config_spec import spec_from_hf_config_file
    from llmbuild.importer.nets import head_net, head_weight_names
    from llmbuild.numerics.stored import StoredTensor

    spec = replace(spec_from_hf_config_file(ROOT / "recipes/configs/deepseek_r1_distill_qwen_1_5b.json"),
                   vocab_size=2048, hidden_size=64)
    rng = np.random.default_rng(7)
    table = rng.standard_normal((spec.vocab_size, spec.hidden_size)).astype(np.float32)
    table *= np.float32(2.0) ** rng.integers(-12, 12, table.shape).astype(np.float32)
    bits = table.view(np.uint32)
    ties = rng.random(table.shape) < 0.05  # exactly halfway between two bf16 values, and between two f16 ones
    bits[ties] = (bits[ties] & 0xFFFF0000) | 0x8000
    bits[ties[::-1]] = (bits[ties[::-1]] & 0xFFFFE000) | 0x1000
    table[0, :4] = [65504.0, -65504.0, 6e-8, 1e-30]  # f16's largest, a subnormal, one that flushes to zero
    module = head_net(spec, net, 16, None)
    storage = mode.lower()
    bmodels = []
    for declared in (None, storage):
        weights = {n: StoredTensor(table, "f32") for n in head_weight_names(spec)}
        weights["norm.weight"] = np.ones(spec.hidden_size, np.float32)
        out = tmp_path / str(declared)
        out.mkdir()
        vendor = export_net(module, weights, f"{net}_top_weights.npz", table_storage=declared)
        assert (f"x{storage}>" in vendor.text()) == (declared is not None)
        (out / f"{net}.mlir").write_text(vendor.text())
        np.savez(out / f"{net}_top_weights.npz", **vendor.weights)
        options = NetOptions(chip="bm1684x", mode=mode, quant_output=net != "lm_head")
        bmodels.append(compile_net(locate(), out, net, options, tmp_path / "jit", out / "tpuc.log").read_bytes())
    assert equal_but_unset_bytes(*bmodels)


@pytest.mark.parametrize("mode", ["BF16", "F32"])
@pytest.mark.parametrize("net", ["lm_head", "embedding"])
def test_a_table_given_in_parts_computes_what_the_whole_table_does(tmp_path, net, mode):
    """A vocabulary table too large for the vendor's code generator in one job is given to it in parts (rows
    of lm_head, columns of the embedding) joined by a Concat: on the cmodel the same token ids and the same
    embedding rows as the net with the table whole, for parts that do not divide the table evenly."""
    from dataclasses import replace

    import numpy as np

    from llmbuild.bmodel.top_export import export_net
    from llmbuild.bmodel.vendor_compile import NetOptions, compile_net
    from llmbuild.frontend.config_spec import spec_from_hf_config_file
    from llmbuild.importer.nets import head_net, head_weight_names
    from llmbuild.numerics.stored import StoredTensor

    spec = replace(spec_from_hf_config_file(ROOT / "recipes/configs/deepseek_r1_distill_qwen_1_5b.json"),
                   vocab_size=2000, hidden_size=64)
    rng = np.random.default_rng(11)
    table = rng.standard_normal((spec.vocab_size, spec.hidden_size)).astype(np.float32)
    module = head_net(spec, net, 16, None)
    if net == "lm_head":
        # each part's rows hold the best token of one input (parts of 2000 rows in 3: 666, 667, 667)
        inputs = [rng.standard_normal((1, spec.hidden_size)).astype(np.float32) for _ in range(3)]
        for k, x in enumerate(inputs):
            table[300 + 667 * k] = 4 * x[0] / np.linalg.norm(x[0]) ** 2 * np.abs(table @ x[0]).max()
    else:
        inputs = [np.array([[0, 1, 665, 666, 667, 1333, 1334, 1999, *rng.integers(0, 2000, 8)]], np.int32)]
    got = {}
    for parts in (1, 3):
        weights = {n: StoredTensor(table, "f32") for n in head_weight_names(spec)}
        weights["norm.weight"] = np.ones(spec.hidden_size, np.float32)
        out = tmp_path / f"parts{parts}"
        out.mkdir()
        vendor = export_net(module, weights, f"{net}_top_weights.npz",
                            table_storage=None if mode == "F32" else mode.lower(), table_parts=parts)
        assert vendor.text().count('"top.Weight"') == parts
        (out / f"{net}.mlir").write_text(vendor.text())
        np.savez(out / f"{net}_top_weights.npz", **vendor.weights)
        options = NetOptions(chip="bm1684x", mode=mode, quant_output=net != "lm_head")
        bmodel = compile_net(locate(), out, net, options, tmp_path / "jit", out / "tpuc.log")
        got[parts] = _launched(bmodel, net, inputs, tmp_path)
    if net == "lm_head":
        assert [int(t.reshape(-1)[0]) for t in got[3]] == [300, 967, 1634]
    for whole, split in zip(got[1], got[3], strict=True):
        assert np.array_equal(whole, split)


_LAUNCH = """
import sys, numpy as np
from llmbuild.runtime.bmodel_cmodel import CmodelRuntime
from llmbuild.runtime.bmodel_run import quiet_simulator
from llmbuild.vendor_toolchain import locate
bmodel, net, given, result = sys.argv[1:]
inputs = np.load(given)
with quiet_simulator(), CmodelRuntime(locate().lib, "bm1684x") as rt:
    rt.load(bmodel)
    np.savez(result, *(rt.launch(net, [inputs[f"arr_{i}"]])[0] for i in range(len(inputs.files))))
"""


def _launched(bmodel: Path, net: str, inputs: list, tmp_path: Path) -> list:
    """The net's first output for each input, on the cmodel in a process of its own (its threads spin until
    their process exits)."""
    import numpy as np

    given, result = tmp_path / "inputs.npz", tmp_path / "outputs.npz"
    np.savez(given, *inputs)
    proc = subprocess.run([sys.executable, "-c", _LAUNCH, str(bmodel), net, str(given), str(result)],
                          capture_output=True, text=True, timeout=600, env=preload_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs = np.load(result)
    return [outputs[f"arr_{i}"] for i in range(len(inputs))]


def test_the_streamed_combine_is_what_model_tool_combines(build_root, tmp_path):
    """llmbuild combines bmodels as a stream (bmodel/combine.py); the vendor's `model_tool --combine` of the
    same parts gives the same nets, fields and data bytes, laid out the same (only the description's own
    flatbuffer layout differs), and the same `model_tool --info`."""
    import subprocess

    from llmbuild.bmodel.combine import combine_stream, content_view
    from llmbuild.bmodel.flat_schema import load_schema
    from llmbuild.bmodel.vendor_compile import combine

    snakemake(build_root, "qwen2_tiny_bf16", *BMODEL)
    build = build_root / "qwen2_tiny_bf16"
    parts = [build / "bmodel" / "head.bmodel", *(build / "bmodel" / "layers" / f"{i}.bmodel" for i in range(4))]
    chain = locate()
    schema = load_schema(chain.bmodel_schema)
    ours = combine_stream(schema, parts, tmp_path / "ours.bmodel")
    theirs = combine(chain, parts, tmp_path / "theirs.bmodel", tmp_path / "theirs.log")
    assert content_view(schema, ours) == content_view(schema, theirs)
    assert ours.read_bytes() == (build / "qwen2_tiny_bf16.bmodel").read_bytes()  # the build's own final combine
    a, b = ours.read_bytes(), theirs.read_bytes()
    assert len(a) == len(b) and a[:20] == b[:20]  # sizes of header, description and data
    start = int.from_bytes(a[4:8], "little") + int.from_bytes(a[8:12], "little")
    assert a[start:] == b[start:]  # the data, byte for byte

    def info(path):
        text = subprocess.run([str(chain.model_tool), "--info", str(path)], capture_output=True, text=True,
                              env=chain.environment(tmp_path, tmp_path), check=True).stdout
        return text.replace(str(path), "FILE")

    assert info(ours) == info(theirs)


def test_a_real_size_model_is_checked_part_by_part_before_the_combine(build_root, tmp_path, monkeypatch):
    """At real size the head, lm_head's twin and the sampled layers are checked each in a job of its own, on
    their own bmodels, as soon as they are combined; the final check finds the nets they ran in the binary
    byte for byte, loads the binary where it fits a job and gathers them. Forced on the tiny model
    (LLMBUILD_SMALL_MODEL_PARAMS=0), its decode nets give the very numbers the whole binary gives them and the
    twin the token lm_head gives; a byte changed in a checked net's weights in the binary fails verify,
    naming the net, and so does a twin whose weights are not lm_head's."""
    snakemake(build_root, "qwen2_tiny_bf16", *BMODEL)
    whole = json.loads((build_root / "qwen2_tiny_bf16" / "bmodel.json").read_text())
    monkeypatch.setenv("LLMBUILD_SMALL_MODEL_PARAMS", "0")
    build = tmp_path / "build"
    snakemake(build, "qwen2_tiny_bf16", *BMODEL)
    out = build / "qwen2_tiny_bf16"
    parts = sorted(p.stem for p in (out / "bmodel" / "checks").glob("*.json"))
    layers = [p for p in parts if p.startswith("layer_")]
    assert set(parts) - set(layers) == {"head", "lm_head"} and len(layers) > 1
    checks = json.loads((out / "bmodel.json").read_text())
    assert checks["coverage"] == COVERAGE_AT_REAL_SIZE and checks["end_to_end"] is None
    decode = {n for n in checks["nets"] if n.startswith("block_cache_")}
    assert decode == {f"block_cache_{p.removeprefix('layer_')}" for p in layers}
    for net in decode:
        assert checks["nets"][net] == whole["nets"][net], net
    # lm_head by its twin without the top-1: the token lm_head itself picks, from lm_head's weight bytes, and
    # the logits it picks from against the reference's
    head, twin = whole["nets"]["lm_head"], checks["nets"]["lm_head"]
    assert twin["run_as"] == "lm_head_logits" and twin["weights_equal_lm_head"] is True
    assert {k: twin[k] for k in head} == head
    assert twin["outputs"]["logits"]["cosine"] >= 0.9999
    assert not list((out / "bmodel" / "nets").glob("*/*.bmodel"))  # the twin too: compiled, read, deleted
    assert "embedding_cache" in checks["nets"] and checks["binary_loaded"]  # run on the combined binary itself
    assert checks["parts_in_binary"] == {"nets": len(decode) + 3, "differing": []}  # + lm_head, the embeddings
    assert json.loads((out / "verify.json").read_text())["passed"]

    # A binary too large to load (a 7B's): its nets' bytes still answer for what the parts ran.
    from llmbuild import LlmbuildError
    from llmbuild.bmodel.combine import read_part
    from llmbuild.bmodel.flat_schema import load_schema
    from llmbuild.recipe.loader import load_recipe
    from llmbuild.steps.bmodel import build_net
    from llmbuild.verify.bmodel_checks import check_bmodel
    from llmbuild.verify.verdict import verify

    monkeypatch.setenv("LLMBUILD_BUILD_DIR", str(build))
    recipe = load_recipe("qwen2_tiny_bf16", ROOT / "recipes")
    assert check_bmodel(recipe, None, load_binary=False)["parts_in_binary"]["differing"] == []
    binary = out / "qwen2_tiny_bf16.bmodel"
    part = read_part(load_schema(locate().bmodel_schema), binary)
    net = next(n for n in part.model["net"] if n["name"] == sorted(decode)[0])
    coeff = net["parameter"][0]["coeff_mem"]["binary_coeff"]
    data = bytearray(binary.read_bytes())
    data[part.data_start + coeff["start"] + coeff["size"] // 2] ^= 0x40
    binary.write_bytes(bytes(data))
    report = check_bmodel(recipe, None, load_binary=False)
    assert not report["binary_loaded"] and "embedding_cache" in report["nets"]  # the head part's run
    assert report["parts_in_binary"]["differing"] == [sorted(decode)[0]]
    with pytest.raises(LlmbuildError, match=f"nets {sorted(decode)[0]} are not the bytes"):
        verify(recipe)
    # a part check written before parts recorded their digests: one line, not a traceback
    head = out / "bmodel" / "checks" / "head.json"
    stale = json.loads(head.read_text())
    del stale["net_digests"]
    head.write_text(json.dumps(stale))
    with pytest.raises(LlmbuildError, match="head.json: no net_digests"):
        check_bmodel(recipe, None, load_binary=False)

    # lm_head's twin answers for lm_head only with lm_head's weight bytes: one byte of lm_head's table changed
    # in the head's bmodel, and the twin's check says so and verify names it
    def part_check(part: str) -> dict:  # in a process of its own: the cmodel's threads outlive its runtime
        result = llmbuild(build, "bmodel-check", "qwen2_tiny_bf16", "--part", part, env={"LLMBUILD_BMODEL": "1"})
        assert result.returncode == 0, result.stderr
        return json.loads((out / "bmodel" / "checks" / f"{part}.json").read_text())

    part_check("head")  # head.json again, with its digests
    build_net(recipe, "lm_head_logits")  # the build deleted it once its check had read it
    head_part = out / "bmodel" / "head.bmodel"
    part = read_part(load_schema(locate().bmodel_schema), head_part)
    net = next(n for n in part.model["net"] if n["name"] == "lm_head")
    coeff = net["parameter"][0]["coeff_mem"]["binary_coeff"]
    data = bytearray(head_part.read_bytes())
    data[part.data_start + coeff["start"] + coeff["size"] // 3] ^= 0x01
    head_part.write_bytes(bytes(data))
    assert part_check("lm_head")["nets"]["lm_head"]["weights_equal_lm_head"] is False
    check_bmodel(recipe, None, load_binary=False)
    with pytest.raises(LlmbuildError, match="its twin lm_head_logits, which the cmodel ran, holds other weight"):
        verify(recipe)


def test_internvl_vit_net_computes_transformers_image_features_on_the_cmodel(build_root):
    """The tiny InternVL in bf16: its vision tower, exported from the ONNX import's TopOp, is the bmodel's
    `vit` net (pixels in, [tokens, hidden] out, as LLM-TPU's demos load it) and gives transformers' own
    image features on the BM1684X cmodel."""
    from llmbuild.runtime.bmodel_inspect import model_info

    snakemake(build_root, "internvl_tiny_bf16", *BMODEL)
    build = build_root / "internvl_tiny_bf16"
    assert json.loads((build / "verify.json").read_text())["passed"]
    vit = json.loads((build / "bmodel.json").read_text())["nets"]["vit"]
    assert vit["image_features"]["cosine"] >= 0.999 and vit["tokens"] == 4, vit
    info = model_info(build / "internvl_tiny_bf16.bmodel")
    assert "input: pixel_values, [1, 3, 56, 56], float32" in info and "output: image_tokens, [4, 64]" in info
    module = (build / "bmodel" / "nets" / "vit" / "vit.mlir").read_text()
    # The pinned attributes: exact GELU, a concatenation the class token (a weight) can take part in.
    assert 'approx_mode = "normal"' in module and "only_merge = false" in module and "top.FAttention" not in module


@pytest.mark.longer("test_internvl_vit_net_computes_transformers_image_features_on_the_cmodel")
def test_at_real_size_the_vit_net_is_compiled_and_not_run_on_the_cmodel(tmp_path, monkeypatch):
    """A real-size tower takes hours on the cmodel: checked as a real-size model (LLMBUILD_SMALL_MODEL_PARAMS=0),
    the tiny InternVL's bmodel holds its `vit` net, the head part runs the embeddings alone, the coverage says
    the vit was not run, and verify passes on what was."""
    from llmbuild.runtime.bmodel_inspect import model_info

    monkeypatch.setenv("LLMBUILD_SMALL_MODEL_PARAMS", "0")
    snakemake(tmp_path, "internvl_tiny_bf16", *BMODEL)
    build = tmp_path / "internvl_tiny_bf16"
    checks = json.loads((build / "bmodel.json").read_text())
    assert checks["coverage"] == COVERAGE_AT_REAL_SIZE and "vit net is compiled, not run" in checks["coverage"]
    assert "vit" not in checks["nets"] and "embedding_cache" in checks["nets"]
    assert "vit" not in json.loads((build / "bmodel" / "checks" / "head.json").read_text())["nets"]
    assert "input: pixel_values, [1, 3, 56, 56], float32" in model_info(build / "internvl_tiny_bf16.bmodel")
    assert json.loads((build / "verify.json").read_text())["passed"]


@pytest.mark.longer("test_internvl_vit_net_computes_transformers_image_features_on_the_cmodel")
def test_a_bmodel_answers_about_an_image_as_transformers_does(build_root, tmp_path):
    """`llmbuild run --bmodel --image` on the tiny InternVL in f32: the image read and tiled as the `.llmb`'s
    runtime does, each tile through the bmodel's `vit` net and its rows in place of the image's tokens, on the
    BM1684X cmodel: transformers' InternVLForConditionalGeneration's greedy ids given the same pixels."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    image_module = pytest.importorskip("PIL.Image")
    import numpy as np

    from llmbuild.runtime.compiled_model import CompiledModel

    snakemake(build_root, "internvl_tiny_f32", *BMODEL)
    build = build_root / "internvl_tiny_f32"
    image = tmp_path / "a.png"
    pixels_rgb = np.random.default_rng(3).integers(0, 256, (90, 70, 3), dtype=np.uint8)  # a 2 x 2 grid, a thumbnail
    image_module.fromarray(pixels_rgb, "RGB").save(image)
    text = [1, 5, 9, 42]
    run = llmbuild(build_root, "run", "internvl_tiny_f32", "--bmodel", "--image", str(image), "--prompt-ids",
                   ",".join(map(str, text)), "--max-new-tokens", "6", "--ignore-eos", "--json")
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)["ids"]
    vision = CompiledModel(build / "internvl_tiny_f32.llmb").vision
    tiles = vision.prepare(image)
    prompt = vision.image_ids(tiles) + text
    model = transformers.InternVLForConditionalGeneration.from_pretrained(
        build / "checkpoint" / "vlm", local_files_only=True).eval()
    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=6, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(input_ids=torch.tensor([prompt]), pixel_values=torch.from_numpy(tiles),
                              generation_config=config)[0, len(prompt):].tolist()
    assert len(tiles) == 5 and got == want


MINICPMV_VIT_SCRIPT = """
import json, sys
from pathlib import Path
from llmbuild.families.minicpmv.verify import vendor_vision_cases
from llmbuild.runtime.bmodel_cmodel import CmodelRuntime
from llmbuild.runtime.bmodel_run import quiet_simulator
from llmbuild.vendor_toolchain import locate
from llmbuild.verify.similarity import similarity

bmodel, vlm = Path(sys.argv[1]), Path(sys.argv[2])
cases = vendor_vision_cases(vlm, 7)
with quiet_simulator(), CmodelRuntime(locate().lib, "bm1684x") as rt:
    rt.load(bmodel)
    info = rt.net_info("vit")
    out = {"inputs": [[t.name, list(t.shapes[0]), t.dtype] for t in info.inputs],
           "cases": {name: similarity(rt.launch("vit", inputs)[0][None], want)["cosine"]
                     for name, inputs, want in cases}}
print("RESULT " + json.dumps(out), flush=True)
"""


def test_minicpmv_vit_net_alone_gives_transformers_image_features_on_the_cmodel(build_root, tmp_path):
    """The tiny MiniCPM-V's `vit` net compiled alone (SigLIP and the resampler, f32), in the inputs LLM-TPU's
    MiniCPM-V runtime feeds (llm_convert's names and order): on the BM1684X cmodel, pieces of five patch
    grids padded to the net's 12 patches give the reference's features (transformers' Idefics2 tower at the
    piece's own size, the published resampler). A tpuc-opt failure on it is one line naming the net and log."""
    net_dir = build_root / "minicpmv_tiny_f32" / "bmodel" / "nets" / "vit"
    snakemake(build_root, f"{net_dir}/vit.bmodel", *BMODEL)
    done = subprocess.run([sys.executable, "-c", MINICPMV_VIT_SCRIPT, str(net_dir / "vit.bmodel"),
                           str(build_root / "minicpmv_tiny_f32" / "checkpoint" / "vlm")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=preload_env())
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]  # the cmodel prints too
    result = json.loads(line.removeprefix("RESULT "))
    assert [name for name, _, _ in result["inputs"]] == ["input_states", "pos_ids", "attn_mask", "pos_embed_ids",
                                                        "resampler_attn_mask"]
    assert [shape for _, shape, _ in result["inputs"]] == [[12, 588], [12], [1, 1, 12, 12], [12], [1, 1, 4, 12]]
    assert [dtype for _, _, dtype in result["inputs"]] == ["float32", "int32", "float32", "int32", "float32"]
    assert len(result["cases"]) == 5 and all(c >= 0.999 for c in result["cases"].values()), result
    shutil.rmtree(net_dir)
    failed = llmbuild(build_root, "bmodel-net", "minicpmv_tiny_f32", "--net", "vit",
                      env={"LLMBUILD_TPU_MLIR": str(fake_toolchain(tmp_path, "exit 3\n"))})
    assert failed.returncode == 2, failed.stderr
    # The error is the last line (before it, torch's own warnings as the job exports the tower), no traceback.
    line = failed.stderr.strip().splitlines()[-1]
    assert line.startswith("llmbuild: error: net vit: tpuc-opt failed (exit 3)") and "tpuc.log" in line
    assert "Traceback" not in failed.stderr and Path(line.rsplit("see ", 1)[1]).is_file()
    assert not (net_dir / "vit.bmodel").exists()


@pytest.mark.longer("test_minicpmv_vit_net_alone_gives_transformers_image_features_on_the_cmodel")
def test_a_minicpmv_bmodel_answers_about_a_sliced_image_as_transformers_does(build_root, tmp_path):
    """The tiny MiniCPM-V in f32 builds its whole bmodel (Qwen2's nets and the vit net, one job each), checked
    and verified: every piece grid's features against the reference, 16 greedy ids. `llmbuild run --bmodel
    --image` slices the image as the `.llmb`'s runtime does (an overview and 2x2 slices), runs each piece
    through the bmodel's vit net on the BM1684X cmodel and puts its rows over the `<unk>` embeddings: the
    reference's greedy ids (transformers' tower and Qwen2ForCausalLM, the published resampler). A piece wider
    than the vit net's position table is one line naming the image, before the simulator starts."""
    image_module = pytest.importorskip("PIL.Image")
    import numpy as np

    from llmbuild.families.minicpmv.reference import reference_generate
    from llmbuild.runtime.bmodel_inspect import model_info
    from llmbuild.runtime.compiled_model import CompiledModel

    snakemake(build_root, "minicpmv_tiny_f32", *BMODEL)
    build = build_root / "minicpmv_tiny_f32"
    assert json.loads((build / "verify.json").read_text())["passed"]
    checks = json.loads((build / "bmodel.json").read_text())
    vit = checks["nets"]["vit"]
    assert vit["image_features"]["cosine"] >= 0.999 and len(vit["cases"]) == 5 and vit["tokens"] == 4, vit
    assert checks["end_to_end"]["tokens_equal"]
    assert "output: image_tokens, [4, 256]" in model_info(build / "minicpmv_tiny_f32.bmodel")
    image = tmp_path / "a.png"
    image_module.fromarray(np.random.default_rng(3).integers(0, 256, (90, 70, 3), dtype=np.uint8), "RGB").save(image)
    text = [1, 5, 9, 42]
    run = llmbuild(build_root, "run", "minicpmv_tiny_f32", "--bmodel", "--image", str(image), "--prompt-ids",
                   ",".join(map(str, text)), "--max-new-tokens", "6", "--ignore-eos", "--json")
    assert run.returncode == 0, run.stderr
    vision = CompiledModel(build / "minicpmv_tiny_f32.llmb").vision
    sliced = vision.prepare(image)
    prompt = vision.image_ids(sliced, 0) + text
    want, _ = reference_generate(build / "checkpoint" / "vlm", prompt, list(sliced.pieces),
                                 int(vision.meta["image_token_id"]), 6)
    assert len(sliced.pieces) == 5 and json.loads(run.stdout)["ids"] == want
    wide = tmp_path / "wide.png"
    image_module.fromarray(np.zeros((20, 100, 3), np.uint8), "RGB").save(wide)
    refused = llmbuild(build_root, "run", "minicpmv_tiny_f32", "--bmodel", "--image", str(wide), "--prompt-ids",
                       "1,2", "--max-new-tokens", "1")
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert f"{wide}: a piece of 6x1 patches: the bmodel's vit net takes pieces of at most 4 patches" in line


@pytest.mark.skipif(not os.environ.get("LLMBUILD_LLM_TPU"), reason="no LLM-TPU checkout (LLMBUILD_LLM_TPU=DIR)")
def test_llm_tpus_own_chat_cpp_runs_the_bmodel_as_llmbuild_does(build_root, tmp_path):
    """LLM-TPU's own runtime (its Qwen3 demo's chat.cpp, built here against the cmodel libraries) on the tiny
    Qwen2's bmodel: both turns of a conversation give the ids llmbuild's driver gives."""
    pytest.importorskip("pybind11")
    snakemake(build_root, "qwen2_tiny_bf16", *BMODEL)
    out = tmp_path / "chat.json"
    done = subprocess.run([sys.executable, "benchmarks/incumbent/llmtpu_chat.py", "--llm-tpu",
                           os.environ["LLMBUILD_LLM_TPU"], "--bmodel",
                           str(build_root / "qwen2_tiny_bf16" / "qwen2_tiny_bf16.bmodel"), "--prompt-ids",
                           "1,5,9,42", "--turn", "11,12,13", "--steps", "4", "--work", str(tmp_path / "work"),
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["equal"] and len(result["llm_tpu_chat"]) == 2 and not result["history_nets"]


@pytest.mark.longer("test_gptqmodel_act_order_checkpoint_compiled_auto_picks_what_gptqmodel_dequantized_picks")
def test_gptq_act_order_bmodel_matches_the_reference(build_root):
    """GPTQ with act order (gptqmodel in the build), 4-bit tied lm_head: the levels and the permutation go to
    the vendor as they are (the incumbent ignores g_idx)."""
    snakemake(build_root, "qwen2_tiny_w4", *BMODEL)
    checks = json.loads((build_root / "qwen2_tiny_w4" / "bmodel.json").read_text())
    worst = min(s["cosine"] for n in checks["nets"].values() for s in n.get("outputs", {}).values())
    assert worst > 0.999
    assert json.loads((build_root / "qwen2_tiny_w4" / "verify.json").read_text())["passed"]


@pytest.mark.longer("tests/test_bmodel_cmodel.py[llmbuild:bm1688:static]")
def test_f32_on_the_bm1688_gives_transformers_greedy_ids(tmp_path):
    recipes = recipes_with(tmp_path, llama_tiny_bm1688="base: llama_tiny_f32\ntarget:\n  chip: bm1688\n")
    build = tmp_path / "build"
    # the bmodel's checks alone (the reference and the bmodel jobs): the .llmb's own tests are elsewhere
    snakemake(build, f"{build}/llama_tiny_bm1688/bmodel.json", *BMODEL, recipes=recipes)
    checks = json.loads((build / "llama_tiny_bm1688" / "bmodel.json").read_text())
    assert "bm1688" in checks["simulator"]
    e2e = checks["end_to_end"]
    assert e2e["tokens_equal"] and len(e2e["ids"]) == 16, e2e
    assert not e2e["teacher_forced_differing"]
    worst = min(s["euclid"] for n in checks["nets"].values() for s in n.get("outputs", {}).values())
    assert worst > 0.9999  # f32: the vendor's arithmetic within float32 rounding of the reference


def test_both_bm1688_cores_build_and_verify_on_its_cmodel(tmp_path):
    """`bmodel.cores: 2`: every block net compiled for the BM1688's two cores, run on its cmodel, verified."""
    from llmbuild.runtime.bmodel_inspect import model_info

    recipes = recipes_with(tmp_path, qwen2_tiny_bm1688_2c="base: qwen2_tiny_bf16\ntarget:\n  chip: bm1688\n"
                                                          "bmodel:\n  cores: 2\n")
    build = tmp_path / "build"
    snakemake(build, "qwen2_tiny_bm1688_2c", *BMODEL, recipes=recipes)
    out = build / "qwen2_tiny_bm1688_2c"
    verdict = json.loads((out / "verify.json").read_text())
    assert verdict["passed"] and verdict["bmodel"]["coverage"] == "every net", verdict
    assert "bm1688" in verdict["bmodel"]["simulator"]
    info = model_info(out / "qwen2_tiny_bm1688_2c.bmodel")
    nets = re.findall(r"^net \d+: \[(\w+)\].*\n(?:addr mode.*\n)?-+\nstage 0, core num: (\d)", info, re.M)
    assert {n: c for n, c in nets if n.startswith("block")} == {f"block{k}_{i}": "2" for i in range(4)
                                                               for k in ("", "_cache")}, nets


def test_a_field_edit_recompiles_the_nets_that_read_it(build_root, tmp_path):
    snakemake(build_root, f"{build_root}/qwen2_tiny_bf16/qwen2_tiny_bf16.bmodel", *BMODEL)
    recipes = recipes_with(tmp_path)
    path = recipes / "qwen2_tiny_f32.yaml"  # qwen2_tiny_bf16's base
    shutil.copy(ROOT / "recipes" / "qwen2_tiny_bf16.yaml", recipes / "qwen2_tiny_bf16.yaml")
    text = (ROOT / "recipes" / "_tiny_common.yaml").read_text()
    (recipes / "_tiny_common.yaml").write_text(text.replace("seq_length: 64", "seq_length: 48"))
    target = f"{build_root}/qwen2_tiny_bf16/qwen2_tiny_bf16.bmodel"
    jobs = planned_jobs(build_root, target, recipes=recipes, config=BMODEL)
    # seq_length: the block nets (their KV cache and RoPE tables), not the head nets
    assert jobs.get("bmodel_net") == 8, jobs
    assert path.is_file()
    (recipes / "_tiny_common.yaml").write_text(text.replace("prefill_length: 16", "prefill_length: 8"))
    # prefill_length: those and `embedding`, with the head's other two nets to combine it again (a net's own
    # bmodel is deleted once combined)
    jobs = planned_jobs(build_root, target, recipes=recipes, config=BMODEL)
    assert jobs.get("bmodel_net") == 11 and jobs.get("bmodel_head") == 1, jobs


def test_two_clean_builds_give_the_same_bytes(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for build in (first, second):
        snakemake(build, f"{build}/llama_tiny_f16/llama_tiny_f16.bmodel", *BMODEL)
    a = (first / "llama_tiny_f16" / "llama_tiny_f16.bmodel").read_bytes()
    b = (second / "llama_tiny_f16" / "llama_tiny_f16.bmodel").read_bytes()
    description = int.from_bytes(a[4:8], "little") + int.from_bytes(a[8:12], "little")
    assert b"Thu Jan  1 00:00:00 1970" in a[:description]  # the creation time, pinned
    assert equal_but_unset_bytes(a, b)


def test_missing_toolchain_is_one_line_and_leaves_no_bmodel(build_root):
    snakemake(build_root, "qwen2_tiny_bf16")
    done = llmbuild(build_root, "bmodel-net", "qwen2_tiny_bf16", "--net", "block_0",
                    env={"LLMBUILD_TPU_MLIR": str(build_root / "nowhere")})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "TPU-MLIR 1.30.2 is not installed" in lines[0] and "scripts/install.sh" in lines[0]
    assert not (build_root / "qwen2_tiny_bf16" / "bmodel" / "nets" / "block_0" / "block_0.bmodel").exists()


def fake_toolchain(root: Path, script: str) -> Path:
    """A toolchain whose tpuc-opt runs `script` (the real one's libraries beside it)."""
    real = locate().root
    fake = root / "tpu_mlir"
    (fake / "bin").mkdir(parents=True)
    (fake / "lib").symlink_to(real / "lib")
    (fake / "cross_toolchains").symlink_to(real / "cross_toolchains")
    tool = fake / "bin" / "tpuc-opt"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    (fake / "bin" / "model_tool").symlink_to(real / "bin" / "model_tool")
    return fake


@pytest.mark.parametrize("script, says", [
    ("echo 'error: the vendor cannot lower this' >&2; exit 1\n", "tpuc-opt failed (exit 1) at --processor-assign"),
    ("kill -SEGV $$\n", "tpuc-opt failed (signal 11) at --processor-assign"),
])
def test_a_failing_tpuc_opt_names_the_net_and_its_log(build_root, tmp_path, script, says):
    snakemake(build_root, "qwen2_tiny_bf16")
    net_dir = build_root / "qwen2_tiny_bf16" / "bmodel" / "nets" / "block_cache_1"
    if net_dir.exists():
        shutil.rmtree(net_dir)
    done = llmbuild(build_root, "bmodel-net", "qwen2_tiny_bf16", "--net", "block_cache_1",
                    env={"LLMBUILD_TPU_MLIR": str(fake_toolchain(tmp_path, script))})
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("llmbuild: error: net block_cache_1: ") and says in line
    log = Path(line.rsplit("see ", 1)[1])
    assert log.is_file() and "tpuc-opt" in log.read_text()
    assert [p.name for p in net_dir.iterdir() if p.suffix == ".bmodel"] == []


def test_a_failing_net_fails_the_build_naming_it(tmp_path):
    """Through Snakemake: the step's one line reaches the terminal, and the binary is not made."""
    build = tmp_path / "build"
    fake = fake_toolchain(tmp_path, "exit 3\n")
    env_before = os.environ.get("LLMBUILD_TPU_MLIR")
    os.environ["LLMBUILD_TPU_MLIR"] = str(fake)
    try:
        done = snakemake(build, f"{build}/llama_tiny_f16/llama_tiny_f16.bmodel", *BMODEL, check=False)
    finally:
        if env_before is None:
            del os.environ["LLMBUILD_TPU_MLIR"]
        else:
            os.environ["LLMBUILD_TPU_MLIR"] = env_before
    assert done.returncode != 0
    assert "tpuc-opt failed (exit 3)" in done.stderr and "see " in done.stderr
    assert not (build / "llama_tiny_f16" / "llama_tiny_f16.bmodel").exists()


def test_gptqmodel_act_order_checkpoint_compiled_auto_picks_what_gptqmodel_dequantized_picks(tmp_path):
    """A checkpoint gptqmodel wrote with act order (real g_idx), through `llmbuild compile --quantize auto`:
    in the context of transformers' own greedy continuation on gptqmodel's dequantization of it (its
    `TorchLinear.dequantize_weight`, kept in the fixture), the bmodel picks transformers' token at every step
    but near ties of the float model (w4bf16 computes in bf16)."""
    import subprocess
    import sys

    import numpy as np
    from helpers import library_dequantized_greedy

    fixture = ROOT / "tests" / "fixtures" / "quant" / "gptq_asym_actorder_g32"
    out = tmp_path / "gptq_act"
    done = subprocess.run([sys.executable, "-m", "llmbuild.cli", "compile", str(fixture), "--quantize", "auto",
                           "--seq-length", "64", "-o", str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    # transformers on gptqmodel's own dequantization of the same checkpoint
    prompt = [3, 14, 15, 92, 65, 35, 89, 79]
    want, logits = library_dequantized_greedy(fixture, tmp_path / "dequantized", prompt, 12)
    # In a process of its own: the cmodel's threads spin until the process that loaded a bmodel exits.
    script = ("import json, sys\n"
              "from llmbuild.runtime.bmodel_cmodel import CmodelRuntime\n"
              "from llmbuild.runtime.bmodel_generate import BmodelLM\n"
              "from llmbuild.vendor_toolchain import locate\n"
              "with CmodelRuntime(locate().lib, 'bm1684x') as rt:\n"
              "    rt.load(sys.argv[1])\n"
              "    picks = BmodelLM(rt).teacher_forced(json.loads(sys.argv[2]), json.loads(sys.argv[3]))\n"
              "print('picks', json.dumps(picks), flush=True)\n")
    ran = subprocess.run([sys.executable, "-c", script, str(out / "gptq_act.bmodel"), json.dumps(prompt),
                          json.dumps(want)], capture_output=True, text=True, timeout=900, env=preload_env())
    assert ran.returncode == 0, ran.stderr[-3000:]
    # (the simulator writes its own lines to stdout too)
    (line,) = [line for line in ran.stdout.splitlines() if line.startswith("picks ")]
    picks = json.loads(line.removeprefix("picks "))
    for k, (pick, token) in enumerate(zip(picks, want, strict=True)):
        top = np.sort(logits[k])[::-1]
        # bf16 activations: a different pick only where the float model's top two are within 1% of its scale
        assert pick == token or top[0] - top[1] < 0.01 * np.abs(logits[k]).max(), (k, pick, token, top[:2])
    assert sum(p == t for p, t in zip(picks, want, strict=True)) >= len(want) - 2

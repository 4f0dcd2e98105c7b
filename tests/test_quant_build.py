"""Builds from checkpoints the quantization libraries wrote (tests/fixtures/quant): the binary against a
float reference that the writing library dequantized itself.

Each fixture becomes a recipe with `quantization: auto`; prepare, plan, layer, head and link run in this
process (the Snakemake DAG runs the same functions, one per job; tests/test_build.py covers it). The
reference is transformers' float32 model of the same architecture whose projections are the library's own
dequantization (`reference_dequant.safetensors`, see the fixtures' README), not llmbuild's reader: the
binary's first-step logits must reach cosine 0.999 with it, and the greedy tokens must agree for 8 steps,
or part only where the reference's two best logits are closer than the binary's own error on them
(a tie broken by bf16 rounding; the gap and the error are printed).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from llmbuild import LlmbuildError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "quant"
NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "reference_dequant.safetensors").is_file())
PROMPT = [1, 5, 9, 42, 7, 100]
STEPS = 8


def _recipe_text(path: Path, mode: str = "auto") -> str:
    arch = json.loads((path / "config.json").read_text())["model_type"]
    return (
        f"description: import {path.name}\narchitecture: {arch}\n"
        f"source: {{kind: hf, path: {path}}}\nquantization: {{mode: {mode}}}\n"
        "stages: {seq_length: 64, prefill_length: 16}\n"
        f"verify: {{prompt_ids: {PROMPT}, max_new_tokens: {STEPS}, exact_tokens: false}}\n"
    )


def _build(tmp: Path, name: str, checkpoint: Path, monkeypatch, mode: str = "auto"):
    from llmbuild.recipe import load_recipe
    from llmbuild.steps.head import build_head
    from llmbuild.steps.layer import build_layer
    from llmbuild.steps.link import link
    from llmbuild.steps.plan import plan
    from llmbuild.steps.prepare import prepare

    recipes = tmp / "recipes"
    recipes.mkdir(exist_ok=True)
    (recipes / f"{name}.yaml").write_text(_recipe_text(checkpoint, mode))
    monkeypatch.setenv("LLMBUILD_BUILD_DIR", str(tmp / "build"))
    recipe = load_recipe(name, recipes)
    prepare(recipe)
    plan(recipe)
    build_layer(recipe, 0)
    build_head(recipe)
    link(recipe)
    return recipe, tmp / "build" / name / f"{name}.llmb"


def _library_reference(path: Path):
    """transformers float32 model: stored float tensors + the library's dequantized projections."""
    import torch
    import transformers
    from safetensors.torch import load_file

    fields = json.loads((path / "config.json").read_text())
    fields.pop("quantization_config")
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**fields),
                                                          dtype=torch.float32)
    stored = {k: v for k, v in load_file(str(path / "model.safetensors")).items() if v.is_floating_point()}
    stored.update(load_file(str(path / "reference_dequant.safetensors")))
    state = model.state_dict()
    tensors = {k: v.float() for k, v in stored.items() if k in state}
    missing = set(state) - set(tensors) - ({"lm_head.weight"} if model.config.tie_word_embeddings else set())
    assert not missing, f"reference lacks {sorted(missing)}"
    model.load_state_dict(tensors, strict=False)
    model.tie_weights()
    return model.eval()


def _greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    import torch

    ids, logits = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            step = model(torch.tensor([ids])).logits[0, -1].double().numpy()
            logits.append(step)
            ids.append(int(np.argmax(step)))
    return ids[len(prompt) :], logits


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("name", NAMES)
def test_library_checkpoint_builds_and_matches_library_dequantization(name, tmp_path, monkeypatch):
    from llmbuild.runtime.compiled_model import CompiledModel

    path = FIXTURES / name
    recipe, binary = _build(tmp_path, name, path, monkeypatch)
    assert recipe.quantization.checkpoint is not None
    model = CompiledModel(binary)
    ids, logits = model.generate(PROMPT, STEPS)
    ref_ids, ref_logits = _greedy(_library_reference(path), PROMPT, STEPS)

    cosine = _cosine(logits[0], ref_logits[0])
    agree = next((i for i, (a, b) in enumerate(zip(ids, ref_ids, strict=True)) if a != b), STEPS)
    print(f"{name}: first-step logits cosine {cosine:.6f}, greedy ids agree for {agree}/{STEPS} steps")
    assert cosine >= 0.999, f"{name}: first-step logits cosine {cosine:.6f}"
    parted = next((i for i, (a, b) in enumerate(zip(ids, ref_ids, strict=True)) if a != b), None)
    if parted is not None:
        # Same prefix up to here, so both logit vectors describe the same step. The device's choice must
        # be the reference's runner-up, behind by less than the device's own logit error on the two.
        ref, own = ref_logits[parted], np.asarray(logits[parted], np.float64)
        best, ours = ref_ids[parted], ids[parted]
        gap = float(ref[best] - ref[ours])
        noise = abs(own[best] - ref[best]) + abs(own[ours] - ref[ours])
        print(f"{name}: greedy ids part at step {parted}: reference gap {gap:.4f}, device error {noise:.4f}")
        assert ours == int(np.argsort(ref)[-2]), f"{name}: step {parted} chose {ours}, not the reference's top 2"
        assert gap <= noise, f"{name}: ids {ids} vs {ref_ids} part at step {parted}: gap {gap:.4f} > error {noise:.4f}"


def test_act_order_checkpoint_gathers_activations(tmp_path, monkeypatch):
    """desc_act: each projection's input is permuted on the device (a tpu.Gather over `.perm`)."""
    name = "gptq_asym_actorder_g32"
    _build(tmp_path, name, FIXTURES / name, monkeypatch)
    text = (tmp_path / "build" / name / "layers" / "0" / "tpu_block_cache_0.mlir").read_text()
    perms = set(re.findall(r"layers\.0\.\w+\.\w+_proj\.perm", text))
    assert len(perms) == 7, perms
    assert text.count('"tpu.Gather"') == 2 + 7  # the two RoPE table lookups and one per projection


def test_mode_must_agree_with_checkpoint_bits(tmp_path, monkeypatch):
    with pytest.raises(LlmbuildError, match=r"quantization.mode: expected auto, w4bf16 or w4f16 .*got w8bf16"):
        _build(tmp_path, "bad_mode", FIXTURES / "gptq_sym_g32", monkeypatch, mode="w8bf16")


def test_library_method_on_quantized_checkpoint_is_refused(tmp_path):
    from llmbuild.recipe import load_recipe

    (tmp_path / "r.yaml").write_text(_recipe_text(FIXTURES / "gptq_sym_g32").replace(
        "quantization: {mode: auto}", "quantization: {mode: w4bf16, method: gptq}"))
    with pytest.raises(LlmbuildError, match=r"r.yaml:4: quantization.method: expected auto .* got gptq"):
        load_recipe("r", tmp_path)


def test_auto_needs_a_quantized_checkpoint(tmp_path):
    from llmbuild.recipe import load_recipe

    shutil.copytree(FIXTURES / "gptq_sym_g32", tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    del config["quantization_config"]
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    (tmp_path / "r.yaml").write_text(_recipe_text(tmp_path / "ckpt").replace("{mode: auto}", "auto"))
    with pytest.raises(LlmbuildError, match=r"quantization.mode: .*auto needs a quantized checkpoint"):
        load_recipe("r", tmp_path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.pop("model.layers.0.mlp.up_proj.qzeros"), r"model.layers.0.mlp.up_proj.qzeros"),
        (lambda t: t.update({"model.layers.0.mlp.up_proj.qweight": t["model.layers.0.mlp.up_proj.qweight"][:4]}),
         r"model.layers.0.mlp.up_proj.qweight.*shape"),
    ],
    ids=["missing-tensor", "wrong-packed-shape"],
)
def test_bad_checkpoint_fails_in_one_line_naming_the_tensor(edit, message, tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file  # the fixture holds bf16 tensors: numpy has no bf16

    ckpt = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "gptq_sym_g32", ckpt)
    tensors = load_file(str(ckpt / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(ckpt / "model.safetensors"))
    with pytest.raises(LlmbuildError, match=message) as info:
        _build(tmp_path, "bad", ckpt, monkeypatch)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "build" / "bad" / "layers" / "0" / "layer.llmo").exists()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("bits", 3, r"bits.*3"), ("group_size", 48, r"48 does not divide|group.*48")],
    ids=["unsupported-bits", "group-not-dividing-K"],
)
def test_bad_quantization_config_fails_in_one_line(field, value, message, tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "gptq_sym_g32", ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["quantization_config"][field] = value
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(LlmbuildError, match=message) as info:
        _build(tmp_path, "bad", ckpt, monkeypatch)
    assert "\n" not in str(info.value)


def test_compile_one_command_writes_recipe_beside_binary_and_runs(tmp_path):
    """`llmbuild compile CKPT --quantize auto ... -o OUT` then `llmbuild run OUT`, as a user types them."""
    import subprocess
    import sys

    from llmbuild.recipe import load_recipe

    # A GPTQ checkpoint as the libraries write it: no chat template (the end-to-end prompt is plain text).
    checkpoint = tmp_path / "gptq_no_template"
    shutil.copytree(FIXTURES / "gptq_asym_g32", checkpoint)
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    config.pop("chat_template")
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(config))
    out = tmp_path / "gptq-tiny v1.0"  # a folder named as users name them: hyphens, a space, a dot
    cmd = [sys.executable, "-m", "llmbuild.cli", "compile", str(checkpoint), "--quantize", "auto",
           "--chip", "bm1688", "--seq-length", "64", "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (out / "gptq-tiny_v1_0.llmb").is_file() and (out / "gptq-tiny_v1_0.yaml").is_file()
    assert "as plain text (the checkpoint has no chat template" in (out / "gptq-tiny_v1_0.yaml").read_text()
    recipe = load_recipe("gptq-tiny_v1_0", out)
    assert (recipe.quantization.mode, recipe.target.chip, recipe.stages.seq_length) == ("w4bf16", "bm1688", 64)
    verdict = json.loads((out / "verify.json").read_text())
    # the vendor's bmodel too (bm1688 is the vendor's; a folder name with a space and a dot: its JIT cache moves)
    assert verdict["passed"] and verdict["bmodel"]["nets_checked"] > 0
    assert (out / "gptq-tiny_v1_0.bmodel").is_file()
    run = subprocess.run([sys.executable, "-m", "llmbuild.cli", "run", str(out), "--prompt-ids", "1,5,9",
                          "--max-new-tokens", "4", "--json"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert len(json.loads(run.stdout)["ids"]) == 4
    # A second compile finds everything up to date: nothing is rebuilt.
    before = (out / "gptq-tiny_v1_0.llmb").stat().st_mtime_ns
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and (out / "gptq-tiny_v1_0.llmb").stat().st_mtime_ns == before


def test_compile_derives_the_recipe_name_from_any_folder_name(tmp_path):
    from llmbuild.steps.oneshot import CompileRequest, build_dir_for, recipe_for

    name, _ = recipe_for(CompileRequest(FIXTURES / "awq_gemm_g32", tmp_path / "qwen2-7b", "auto", "bm1684x", 64))
    assert name == "qwen2-7b"  # folders are named with hyphens
    out = tmp_path / "my model.v2"
    name, text = recipe_for(CompileRequest(FIXTURES / "awq_gemm_g32", out, "auto", "bm1684x", 64))
    assert name == "my_model_v2" and build_dir_for(out, name) == out / ".llmbuild"
    assert f"snakemake my_model_v2 --config recipes_dir='{out}' build_dir='{out / '.llmbuild'}'" in text


@pytest.mark.parametrize(("fixture", "method"), [("awq_gemm_qwen3_g32", "awq"), ("gptq_qwen3_sym_g32", "gptq")])
def test_compile_writes_a_qwen3_recipe_for_each_quantized_layout(fixture, method, tmp_path):
    """`llmbuild compile DIR --quantize auto` on a Qwen3 AWQ (AutoAWQ) or GPTQ (gptqmodel) directory: the
    recipe it writes names the qwen3 family and imports the checkpoint's own 4-bit weights (the build
    itself is test_library_checkpoint_builds_and_matches_library_dequantization's)."""
    from llmbuild.recipe import load_recipe
    from llmbuild.steps.oneshot import CompileRequest, recipe_for

    out = tmp_path / "qwen3-tiny"
    name, text = recipe_for(CompileRequest(FIXTURES / fixture, out, "auto", "bm1684x", 64))
    out.mkdir()
    (out / f"{name}.yaml").write_text(text)
    recipe = load_recipe(name, out)
    assert recipe.architecture == "qwen3"
    assert (recipe.quantization.mode, recipe.quantization.checkpoint.method) == ("w4bf16", method)
    assert recipe.quantization.checkpoint.group_size == 32


def test_recipe_quantization_fields_are_checked_when_loading(tmp_path):
    from llmbuild.recipe import load_recipe

    base = "base: qwen2_tiny_f32\nquantization:\n"
    shutil.copy(Path(__file__).resolve().parents[1] / "recipes" / "qwen2_tiny_f32.yaml", tmp_path)
    shutil.copy(Path(__file__).resolve().parents[1] / "recipes" / "_tiny_common.yaml", tmp_path)
    cases = {
        "typo": ("  mode: w4bf16\n  method: autoround\n  options: {itters: 5}\n",
                 r"typo.yaml:5: quantization.options: expected options of autoround: .*itters is not an option"),
        "rtn_options": ("  mode: w4bf16\n  options: {iters: 5}\n", r"quantization.options: expected no options"),
        "float_head": ("  mode: bf16\n  lm_head: w8\n", r"quantization.lm_head: expected float for float mode bf16"),
        "float_method": ("  mode: bf16\n  method: gptq\n", r"quantization.method: expected auto for float mode"),
        "no_text": ("  mode: w4bf16\n  method: gptq\n  calibration: missing.txt\n",
                    r"quantization.calibration: expected a text file, got .*missing.txt \(not found\)"),
    }
    for name, (body, message) in cases.items():
        (tmp_path / f"{name}.yaml").write_text(base + body)
        with pytest.raises(LlmbuildError, match=message):
            load_recipe(name, tmp_path)

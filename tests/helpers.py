"""What several test files share: building recipes with Snakemake into a test directory, running the
`llmbuild` command, and transformers' own greedy generation on a checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


# A minimal valid recipe (tests/test_recipe.py's error tests name its line numbers).
MINIMAL_RECIPE = """\
description: test recipe
architecture: qwen2
source:
  kind: synthetic
  seed: 0
  config:
    model_type: qwen2
    vocab_size: 512
stages:
  seq_length: 64
  prefill_length: 16
verify:
  prompt_ids: [1, 2]
  top_cosine: 0.99
"""
#  1 description   2 architecture   3 source   4 kind   5 seed   6 config   7 model_type
#  8 vocab_size    9 stages        10 seq_length   11 prefill_length   12 verify
# 13 prompt_ids   14 top_cosine


def _env(build: Path, recipes: Path | None = None, models: Path | None = None) -> dict[str, str]:
    # The vendor's bmodel only where a test asks for it (`--config bmodel=true`): each tiny recipe's would
    # add half a minute of TPU-MLIR compiles and cmodel runs to every build the tests make.
    env = dict(os.environ, LLMBUILD_BUILD_DIR=str(build), HF_HUB_OFFLINE="1", LLMBUILD_BMODEL="0")
    if recipes is not None:
        env["LLMBUILD_RECIPES"] = str(recipes)
    if models is not None:
        env["LLMBUILD_MODELS"] = str(models)
    return env


def snakemake(build: Path, *args: str, recipes: Path | None = None, check: bool = True,
              models: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", *args]
    result = subprocess.run(cmd, cwd=ROOT, env=_env(build, recipes, models), capture_output=True, text=True,
                            timeout=2700)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def nan_weights_recipe(recipes: Path, checkpoint: Path) -> str:
    """A recipe `nan_weights` in `recipes` whose checkpoint (the kept corpus's, made in `checkpoint`) has a
    NaN weight: the recipe loads, its `prepare` step refuses the weight. Returns its name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_corpus", ROOT / "tests" / "corpus" / "make_corpus.py")
    corpus = importlib.util.module_from_spec(spec)
    sys.modules["make_corpus"] = corpus  # dataclasses look their module up while the class is built
    spec.loader.exec_module(corpus)
    corpus._nan_weight(checkpoint)
    (recipes / "nan_weights.yaml").write_text(
        f"description: a checkpoint with a NaN weight\narchitecture: qwen2\nsource:\n  kind: hf\n"
        f"  path: {json.dumps(str(checkpoint))}\nquantization:\n  mode: f32\n"
        "stages:\n  seq_length: 64\n  prefill_length: 16\nverify:\n  prompt_ids: [1, 5, 9, 42]\n")
    return "nan_weights"


def build_tiny_internvl_dir(tmp_path: Path, directory: Path, name: str) -> Path:
    """Build the tiny InternVL checkpoint in `directory` (either layout) through a recipe `name` that reads
    it as an hf source, as a user's recipe would; returns the build folder."""
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "_tiny_common.yaml").write_text((ROOT / "recipes" / "_tiny_common.yaml").read_text())
    (recipes / f"{name}.yaml").write_text(
        f"base: _tiny_common\ndescription: the tiny InternVL from {directory.name}\narchitecture: qwen2\n"
        f"source:\n  kind: hf\n  path: {directory}\nvision:\n  family: internvl\n  max_tiles: 4\nquantization:\n"
        "  mode: f32\n")
    build = tmp_path / "build"
    snakemake(build, name, recipes=recipes)
    return build


def planned_jobs(build: Path, target: str, recipes: Path | None = None, models: Path | None = None,
                 config: tuple[str, ...] = ()) -> dict[str, int]:
    """The jobs a dry run would execute, by rule (from Snakemake's job-stats table)."""
    return job_stats(snakemake(build, "-n", target, *config, recipes=recipes, models=models).stdout)


def job_stats(out: str) -> dict[str, int]:
    """Snakemake's job-stats table in its output, by rule (empty when it printed none)."""
    jobs: dict[str, int] = {}
    lines = out.splitlines()
    if "Job stats:" not in lines:
        return jobs
    for line in lines[lines.index("Job stats:") + 3 :]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        jobs[parts[0]] = int(parts[1])
    return jobs


def llmbuild(
    build: Path, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmbuild.cli", *args], cwd=ROOT, env={**_env(build), **(env or {})},
        capture_output=True, text=True, timeout=600, input=stdin,
    )


def hf_generate(
    checkpoint: Path, prompt: list[int], steps: int, stop_at_eos: bool = True
) -> tuple[list[int], np.ndarray]:
    """transformers' greedy ids after `prompt`, and its logits for the prompt's last token."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    if not stop_at_eos:
        model.generation_config.eos_token_id = None
    with torch.no_grad():
        first = model(torch.tensor([prompt])).logits[0, -1].numpy()
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False, pad_token_id=0)
    return ids[0, len(prompt) :].tolist(), first


def random_net_inputs(module, vocab: int, prefill_length: int, seq_length: int, history: int,
                      rng: np.random.Generator, prefill_rows: int | None = None) -> dict[str, np.ndarray]:
    """Inputs for one TopOp net: random ids and hidden states, the stage's positions and mask (prefill
    with `prefill_rows` real rows, default all; prefill_kv and decode after `history` cached tokens)."""
    from llmbuild.dialects.plain import main_func, string_list, tensor_info
    from llmbuild.numerics import masks

    fn = main_func(module)
    L, S = prefill_length, seq_length
    pos, mask = {
        "prefill": lambda: masks.prefill(prefill_rows or L, L, S),
        "prefill_kv": lambda: masks.prefill_kv(L, history, L, S),
        "decode": lambda: masks.decode(history, S),
        "head": lambda: (None, None),
    }[module.attributes["top.stage"].data]()
    out: dict[str, np.ndarray] = {}
    for name, arg in zip(string_list(fn.attributes["arg_names"]), fn.body.block.args, strict=True):
        shape = tensor_info(arg.type).shape
        if name == "input_ids":
            out[name] = rng.integers(0, vocab, shape).astype(np.int32)
        elif name == "position_ids":
            out[name] = pos
        elif name == "attention_mask":
            out[name] = mask
        else:
            out[name] = rng.standard_normal(shape).astype(np.float32)
    return out


def library_dequantized_greedy(fixture: Path, out: Path, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """transformers' greedy ids after `prompt` on a quantized fixture's own library dequantization (its
    `reference_dequant.safetensors`, tests/fixtures/quant/README.md) written as a float checkpoint in `out`,
    and its logits at each step (teacher-forced on those ids)."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    shutil.copytree(fixture, out, dirs_exist_ok=True)
    tensors = {k: v for k, v in load_file(fixture / "model.safetensors").items()
               if not k.endswith((".qweight", ".qzeros", ".scales", ".g_idx"))}
    tensors.update(load_file(fixture / "reference_dequant.safetensors"))  # float32, the library's code
    save_file(tensors, out / "model.safetensors")
    (out / "reference_dequant.safetensors").unlink()
    config = json.loads((out / "config.json").read_text())
    config.pop("quantization_config")
    (out / "config.json").write_text(json.dumps(config))
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False, pad_token_id=0)[0]
        logits = model(ids[None]).logits[0, len(prompt) - 1:-1].numpy()
    return ids[len(prompt):].tolist(), logits


def equal_but_unset_bytes(a: bytes, b: bytes) -> bool:
    """Two bmodels of the same net equal but for lm_head's bytes that the vendor's code generator leaves
    unset (llmbuild.bmodel.bmodel_file.only_unset_bytes)."""
    from llmbuild.bmodel.bmodel_file import only_unset_bytes

    if len(a) != len(b):
        return False
    return only_unset_bytes(np.flatnonzero(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8)).tolist())


def plan_file(plan, directory: Path) -> Path:
    """`plan` (a MemoryPlan) written where `compile_net`'s assign-address pass reads it, as the build's
    `llmbuild plan` step writes plan.json."""
    path = directory / "plan.json"
    path.write_text(plan.to_json())
    return path


def stored_weight(rng: np.random.Generator, n: int, k: int, storage: str) -> tuple[np.ndarray, np.ndarray]:
    """A random [n, k] weight: (as stored in `storage` f32/bf16/f16, its float32 values)."""
    from llmbuild.numerics.formats import decode, encode

    values = rng.standard_normal((n, k)).astype(np.float32)
    if storage == "f32":
        return values, values
    raw = encode(values, storage)
    return raw, decode(raw, storage)


def build_in_process(recipe_name: str, build: Path, recipes: Path) -> Path:
    """A shipped recipe built by the library steps the rules run (prepare, plan, layers, head, the vit net of
    a vision-language recipe, link), in this process and without the vendor's bmodel: its build directory."""
    import os

    from llmbuild.artifacts.paths import BuildPaths, read_spec
    from llmbuild.recipe import load_recipe
    from llmbuild.steps.head import build_head
    from llmbuild.steps.layer import build_layer
    from llmbuild.steps.link import link
    from llmbuild.steps.plan import plan
    from llmbuild.steps.prepare import prepare
    from llmbuild.steps.vision import build_vision

    saved = {k: os.environ.get(k) for k in ("LLMBUILD_BUILD_DIR", "LLMBUILD_BMODEL")}
    os.environ.update(LLMBUILD_BUILD_DIR=str(build), LLMBUILD_BMODEL="0")
    try:
        recipe = load_recipe(recipe_name, recipes)
        prepare(recipe)
        plan(recipe)
        paths = BuildPaths.of(recipe)
        for layer in range(read_spec(paths.spec).num_layers):
            build_layer(recipe, layer)
        build_head(recipe)
        if recipe.vision is not None:
            build_vision(recipe)
        link(recipe)
        return paths.root
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

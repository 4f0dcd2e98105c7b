"""The whole path, as a user runs it: snakemake builds every shipped recipe, the binaries run, and the
results are checked against transformers computed here, independently of the build's own checks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, _env, hf_generate, llmbuild, planned_jobs, snakemake

PROMPT = [1, 5, 9, 42]


@pytest.fixture(scope="session")
def build(build_root: Path) -> Path:
    """`snakemake --cores 2 all`: every shipped recipe, from clean, into the session's build directory
    (shared with the runtime tests: Snakemake builds what is missing, nothing twice)."""
    snakemake(build_root, "all")
    return build_root


def run_json(build: Path, recipe: str, *extra: str) -> dict:
    r = llmbuild(build, "run", recipe, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "32",
                 "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("recipe", ["qwen2_tiny_f32", "llama_tiny_f32", "qwen3_tiny_f32"])
def test_f32_binary_generates_the_greedy_ids_of_transformers(build: Path, recipe: str) -> None:
    got = run_json(build, recipe, "--ignore-eos")
    want, _ = hf_generate(build / recipe / "checkpoint", PROMPT, 32, stop_at_eos=False)
    assert got["ids"] == want and len(want) == 32
    assert len(got["logits"]) == 32 and len(got["logits"][0]) == 512
    # Stopping at the checkpoint's EOS, both stop at the same step.
    stopping, _ = hf_generate(build / recipe / "checkpoint", PROMPT, 32)
    assert run_json(build, recipe)["ids"] == stopping


@pytest.mark.parametrize("recipe", ["qwen2_tiny_bf16", "llama_tiny_f16"])
def test_low_precision_first_logits_match_transformers_f32(build: Path, recipe: str) -> None:
    from llmbuild.verify.similarity import cosine

    got = run_json(build, recipe)
    _, first = hf_generate(build / recipe / "checkpoint", PROMPT, 1)
    c = cosine(np.array(got["logits"][0]), first)
    assert c >= 0.999, c
    # and the precision is really lower: not an f32 binary under another name
    assert c < 0.9999999


def test_smollm2_replies_the_same_on_any_thread_count(build: Path) -> None:
    """The first reply token is a near-tie ("The" 25.33 against "L" 25.24 in transformers f32): BLAS's
    thread-dependent sums once answered "L'Étoile, la Marseillaise..." on 2 threads and "Paris" on one.
    The runtime's products must not depend on the machine's thread count (numerics/matrix_product.py).
    Which of the two the bf16 binary picks is its rounding's (bf16 activations move these logits by about
    0.15 either way): its reply starts with one of transformers' two and goes on as the model does."""
    replies = []
    for threads in ("1", "2", "3"):
        r = llmbuild(build, "run", "smollm2_135m_bf16", "--prompt", "What is the capital of France?", "--json",
                     "--max-new-tokens", "16", env={"OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads})
        assert r.returncode == 0, r.stderr
        replies.append(json.loads(r.stdout))
    text = replies[0]["text"]
    assert text.startswith("The capital of France is Paris") or text.startswith("L'"), text
    assert replies[1] == replies[0] and replies[2] == replies[0]  # ids, text and every logit, bit for bit


def test_smollm2_w8_answers_with_paris_from_a_smaller_binary(build: Path) -> None:
    r = llmbuild(build, "run", "smollm2_135m_w8", "--prompt", "What is the capital of France?")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    w8 = (build / "smollm2_135m_w8" / "smollm2_135m_w8.llmb").stat().st_size
    bf16 = (build / "smollm2_135m_bf16" / "smollm2_135m_bf16.llmb").stat().st_size
    # projections at 1 byte (+ per-channel scale/zero), the 28M-parameter bf16 embedding unchanged
    assert w8 < 0.65 * bf16, (w8, bf16)
    report = json.loads(llmbuild(build, "inspect", "smollm2_135m_w8", "--json").stdout)
    # one byte per level of the seven projections (q, o, k, v, gate, up, down) plus one zero point per
    # output channel (8-bit is per channel); the embedding stays bf16
    levels = 30 * (576 * 576 * 2 + 2 * 192 * 576 + 3 * 1536 * 576)
    zeros = 30 * (576 * 2 + 192 * 2 + 1536 * 2 + 576)
    assert report["weight_elements_by_dtype"]["u8"] == levels + zeros
    assert report["weight_elements_by_dtype"]["bf16"] == 49152 * 576 + 30 * (2 * 576 + 5184) + 576


def test_smollm2_w4_gptq_chats_about_paris_from_under_40_percent_of_bf16(build: Path) -> None:
    """GPTQ in the build on the real model, 8-bit lm_head shared with the embedding lookup."""
    r = llmbuild(build, "chat", "smollm2_135m_w4", "--max-new-tokens", "24",
                 stdin="What is the capital of France?\n")
    assert r.returncode == 0, r.stderr
    replies = [line for line in r.stdout.splitlines() if line.startswith("assistant> ")]
    assert len(replies) == 1 and "Paris" in replies[0], r.stdout
    w4 = (build / "smollm2_135m_w4" / "smollm2_135m_w4.llmb").stat().st_size
    bf16 = (build / "smollm2_135m_bf16" / "smollm2_135m_bf16.llmb").stat().st_size
    assert w4 < 0.40 * bf16, (w4, bf16)
    report = json.loads(llmbuild(build, "inspect", "smollm2_135m_w4", "--json").stdout)
    # 4-bit levels two per byte plus a zero point per group of 64, for the seven projections; the tied
    # embedding / lm_head table once, at one byte per level plus one zero point per row; nothing in bf16
    # but norms and scales.
    per_layer = 576 * 576 * 2 + 2 * 192 * 576 + 3 * 1536 * 576
    zeros = 30 * (per_layer // 64)
    assert report["weight_elements_by_dtype"]["u8"] == 30 * per_layer // 2 + zeros + 49152 * 576 + 49152
    quantize = json.loads((build / "smollm2_135m_w4" / "quantize.json").read_text())
    assert quantize["library"] == "gptqmodel" and quantize["params"]["group_size"] == 64


def test_every_build_passed_its_verification(build: Path) -> None:
    from llmbuild.recipe import list_recipes
    from llmbuild.steps.dag import recipe_problems

    recipes = list_recipes(buildable_only=True)
    skipped, broken = recipe_problems(recipes)  # the 7B/8B recipes, unless LLMBUILD_MODELS holds them
    assert broken == {}
    for recipe in [r for r in recipes if r not in skipped]:
        report = json.loads((build / recipe / "verify.json").read_text())
        assert report["passed"] and report["checks"] > 0, recipe
        assert report["worst_cosine"]["top_vs_source"] >= 0.9999, recipe
        # The quantized or GGUF tensors it imports, read again by the writing library's (or gguf's) code.
        independent = report["independent_dequantization"]
        assert independent["equal"] is not False, (recipe, independent)
        if recipe in ("qwen2_tiny_w4", "llama_tiny_w4_awq", "smollm2_135m_bf16"):
            assert independent["library"] and independent["equal"] is True, (recipe, independent)


def test_real_checkpoints_sit_inside_their_error_budget_and_a_tenfold_error_would_fail(build: Path) -> None:
    """The default tolerances are an error budget (llmbuild/recipe/tolerances.py): the shipped builds of a real
    checkpoint (SmolLM2, every mode) use at most two thirds of it, and more than a tenth wherever a recorded
    similarity shows the error, so ten times their error fails."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from margins import margins

    from llmbuild.recipe import load_recipe
    from llmbuild.recipe.tolerances import KINDS, relative_error

    names = [n for n in ("smollm2_135m_bf16", "smollm2_135m_hf_bf16", "smollm2_135m_w4", "smollm2_135m_w8")
             if (build / n / "e2e.json").is_file()]  # the HF directory is a checkpoint some machines lack
    assert len(names) >= 3, names
    for name in names:
        worst, tolerances = margins(build / name), load_recipe(name).verify
        for kind in KINDS:
            share = relative_error(kind, worst[kind]) / relative_error(kind, getattr(tolerances, kind))
            assert share <= 2 / 3, (name, kind, share)
            if kind.endswith("euclid") or kind == "logits_cosine":
                assert share > 0.1, (name, kind, share)


def test_every_mlir_file_parses_with_upstream_mlir_opt(build: Path) -> None:
    tool = shutil.which("mlir-opt-22") or shutil.which("mlir-opt")
    if tool is None:
        if os.environ.get("CI"):
            pytest.fail("mlir-opt-22 is not installed (scripts/install.sh installs mlir-22-tools)")
        pytest.skip("mlir-opt-22 not installed")
    files = sorted(build.glob("*/layers/*/*.mlir")) + sorted(build.glob("*/head/*.mlir"))
    vision = sorted(build.glob("*/vision/*.mlir"))  # the vit nets: ops imported from ONNX
    assert len(files) > 100 and len(vision) >= 4
    files += vision
    # One mlir-opt call per file would take minutes: join them with the split marker instead.
    joined = "\n// -----\n".join(f.read_text() for f in files)
    r = subprocess.run([tool, "--allow-unregistered-dialect", "--split-input-file"], input=joined,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[:2000]
    assert r.stdout.count("tpu.MatMul") > 0 and r.stdout.count("top.RMSNorm") > 0
    assert r.stdout.count("tpu.LayerNorm") > 0 and r.stdout.count("top.GELU") > 0


def test_second_run_has_nothing_to_do(build: Path) -> None:
    assert planned_jobs(build, "all") == {}


def test_layer_weights_are_stored_once_and_the_binary_is_deterministic(build: Path, tmp_path: Path) -> None:
    from llmbuild.binary.container import Container

    binary = build / "qwen2_tiny_f32" / "qwen2_tiny_f32.llmb"
    with Container(binary) as c:
        weights = c.entries["weights"].size
        meta = json.loads(bytes(c.section("meta")))
    spec = meta["spec"]
    params = spec["vocab_size"] * spec["hidden_size"] + spec["hidden_size"]  # tied embedding + final norm
    params += spec["num_layers"] * sum(int(np.prod(s)) for s in _layer_shapes(spec))
    assert weights < 1.2 * 4 * params + 4096 * (8 * spec["num_layers"] + 8), "weights stored more than once"
    assert {n["stage"] for n in meta["nets"]} == {"prefill", "prefill_kv", "decode", "head"}

    again = tmp_path / "build"
    snakemake(again, "qwen2_tiny_f32")
    assert (again / "qwen2_tiny_f32" / "qwen2_tiny_f32.llmb").read_bytes() == binary.read_bytes()
    for f in sorted((build / "qwen2_tiny_f32" / "layers").glob("*/*.mlir")):
        assert (again / f.relative_to(build)).read_text() == f.read_text()

    # An edit rebuilt incrementally gives what a clean build of the edited recipe gives, byte for byte: the
    # prefill length reruns every step but prepare (docs/reruns.md), so no step may be left stale.
    from llmbuild.steps.rerun_table import flip_in_place

    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", recipes)
    flip_in_place(recipes, "qwen2_tiny_f32", "stages.prefill_length", 8)
    snakemake(again, "qwen2_tiny_f32", recipes=recipes)
    clean = tmp_path / "clean"
    snakemake(clean, "qwen2_tiny_f32", recipes=recipes)
    rebuilt, fresh = _artifacts(again / "qwen2_tiny_f32"), _artifacts(clean / "qwen2_tiny_f32")
    assert rebuilt.keys() == fresh.keys() and len(rebuilt) > 20
    assert [f for f in rebuilt if rebuilt[f] != fresh[f]] == []
    assert _artifacts(again / "qwen2_tiny_f32")["plan.json"] != _artifacts(build / "qwen2_tiny_f32")["plan.json"]


def _layer_shapes(spec: dict) -> list[tuple[int, ...]]:
    h, d, f = spec["hidden_size"], spec["head_dim"], spec["intermediate_size"]
    q, kv = spec["num_heads"] * d, spec["num_kv_heads"] * d
    shapes = [(h,), (q, h), (kv, h), (kv, h), (h, q), (h,), (f, h), (f, h), (h, f)]
    if spec["qkv_bias"]:
        shapes += [(q,), (kv,), (kv,)]
    return shapes


# A sample of fields (docs/reruns.md lists them all) in which every step of a build without the bmodel reads
# some field: Snakemake's dry run after the edit plans exactly the steps the table says.
RERUN_SAMPLE = [
    ("qwen2_tiny_f32", "verify.top_cosine"), ("qwen2_tiny_f32", "quantization.mode"),
    ("qwen2_tiny_f32", "quantization.group_size"), ("qwen2_tiny_f32", "verify.check_tokens"),
    ("qwen2_tiny_f32", "verify.max_new_tokens"), ("qwen2_tiny_f32", "target.device_memory_bytes"),
    ("qwen2_tiny_f32", "stages.prefill_length"), ("qwen2_tiny_f32", "source.seed"),
    ("internvl_tiny_f32", "vision.max_tiles"), ("internvl_tiny_f32", "vision.image_cosine"),
    ("internvl_tiny_f32", "vision.config"), ("qwen2_tiny_w4", "quantization.calibration_samples"),
]


def _planned_steps(jobs: dict[str, int], recipe: str) -> set[str]:
    """The steps of a dry run's jobs (a layer or check shard is its step)."""
    named = {"head_check": "check", "bmodel_layer": "bmodel_combine_layer", "bmodel_head": "bmodel_combine_head",
             "bmodel": "bmodel_combine", "bmodel_check_part": "bmodel_check"}
    steps = set()
    for rule in jobs:
        if rule != recipe:
            steps.add(named.get(rule, rule.split("_")[0].removesuffix("s")
                                if rule.startswith(("layers_", "checks_")) else rule))
    return steps


@pytest.mark.parametrize("recipe, field", RERUN_SAMPLE)
def test_a_field_change_reruns_the_steps_the_table_says(build: Path, tmp_path: Path, recipe: str, field: str) -> None:
    from llmbuild.steps.rerun_table import flip_in_place, flips

    flip = {f.field: f for f in flips(recipe, ROOT / "recipes")}[field]
    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", recipes)
    flip_in_place(recipes, recipe, field, flip.value)
    expected = {s for s in (*flip.direct, *flip.downstream) if not s.startswith("bmodel")}  # built without it
    assert _planned_steps(planned_jobs(build, recipe, recipes), recipe) == expected


def _artifacts(build: Path) -> dict[str, bytes]:
    """A build's outputs that do not carry a time: the binary, every module and program, the plan, the
    reference, the checks' metrics, the modelled performance, the end-to-end result (its host time left out)."""
    out = {}
    for path in sorted(build.rglob("*")):
        rel = str(path.relative_to(build))
        if path.suffix in (".llmb", ".mlir", ".llmo", ".safetensors") or path.name in (
                "plan.json", "memory.json", "spec.json", "perf.json", "metrics.json"):
            out[rel] = path.read_bytes()
        elif path.name == "e2e.json":
            data = json.loads(path.read_text())
            data.pop("host_seconds")
            out[rel] = json.dumps(data, sort_keys=True).encode()
    return out


def test_a_failed_check_names_layer_stage_and_op_and_leaves_no_report(build: Path, tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", recipes)
    # bf16 cannot reach these tolerances: verification must fail, and say where first (the embedding
    # table, rounded to bf16, is the first op of the model).
    (recipes / "qwen2_tiny_strict.yaml").write_text(
        "base: qwen2_tiny_bf16\nverify:\n  tpu_cosine: 1.0\n  tpu_euclid: 1.0\n"
    )
    out = tmp_path / "build"
    result = snakemake(out, "qwen2_tiny_strict", recipes=recipes, check=False)
    assert result.returncode != 0
    assert not (out / "qwen2_tiny_strict" / "verify.json").exists()
    log = (out / "qwen2_tiny_strict" / "logs" / "verify.log").read_text()
    assert "net embedding: tpu vs top diverged at output hidden_states" in log, log
    assert "first op: embed_tokens" in log, log
    assert log.count("\n") == 1, "one line"
    failed = json.loads((out / "qwen2_tiny_strict" / "verify.failed.json").read_text())
    assert not failed["passed"]
    assert any(f.startswith("layer 0, stage prefill: tpu vs top") and "first op: layers.0." in f
               for f in failed["failures"]), failed["failures"]
    # At the recipe's own tolerances the build passes, and the earlier failure's report is gone with it.
    (recipes / "qwen2_tiny_strict.yaml").write_text("base: qwen2_tiny_bf16\n")
    snakemake(out, "qwen2_tiny_strict", recipes=recipes)
    assert json.loads((out / "qwen2_tiny_strict" / "verify.json").read_text())["passed"]
    assert not (out / "qwen2_tiny_strict" / "verify.failed.json").exists()


def test_a_chat_template_the_runtime_renders_otherwise_fails_verification(build: Path, tmp_path: Path) -> None:
    """The end-to-end check compares the runtime's rendering of verify.prompt with transformers'; verify
    reads the comparison."""
    out = tmp_path / "build"
    shutil.copytree(build / "smollm2_135m_bf16", out / "smollm2_135m_bf16",
                    ignore=shutil.ignore_patterns("*.llmb", "reference.safetensors"))
    e2e = out / "smollm2_135m_bf16" / "e2e.json"
    data = json.loads(e2e.read_text())
    assert data["chat_template_ids_equal"] is True
    e2e.write_text(json.dumps({**data, "chat_template_ids_equal": False}))
    result = llmbuild(out, "verify", "smollm2_135m_bf16")
    assert result.returncode == 2 and "chat template gives other prompt ids" in result.stderr, result.stderr


def test_a_layer_whose_command_stream_no_checked_layer_ran_fails_link(build: Path, tmp_path: Path) -> None:
    """The device checks run the command stream of the sampled layers (0, 2 and 3 of four); layer 1's
    changed by hand (one command's tile rows) is then a stream nothing ran: link refuses, naming it."""
    from dataclasses import replace

    from llmbuild.binary.container import Container, write_container
    from llmbuild.binary.program import decode, encode

    recipe = "qwen2_tiny_f32"
    copy = tmp_path / "build"
    shutil.copytree(build / recipe, copy / recipe)
    obj_path = copy / recipe / "layers" / "1" / "layer.llmo"
    obj = Container(obj_path)
    sections = []
    for name in obj.names():
        data = bytes(obj.section(name))
        if name.startswith("net:") and decode(data).stage == "decode":
            prog = decode(data)
            group = prog.groups[0]
            prog.groups[0] = replace(group, tile_rows=group.tile_rows + 1)
            data = encode(prog)
        sections.append((name, [data]))
    del obj
    write_container(obj_path, sections)
    binary = copy / recipe / f"{recipe}.llmb"
    binary.unlink()
    # (The weight files went as temp after the first link; the streams are compared before they are read.)
    result = llmbuild(copy, "link", recipe)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].endswith(
        "layer 1's decode command stream differs from every device-checked layer's (0, 2, 3) beyond its base "
        "addresses: it would run on the chip unchecked"), result.stderr
    assert not binary.exists()


def test_every_tiny_recipe_s_host_path_equals_its_device_bit_for_bit(build: Path) -> None:
    """The host path claims the simulated device's arithmetic: on every shipped tiny recipe (every mode,
    family and quantization the shipped recipes have) the same ids and the same logits, array for array,
    and a second turn's prefill on the cache."""
    from llmbuild.recipe import list_recipes
    from llmbuild.runtime.compiled_model import CompiledModel

    tiny = [r for r in list_recipes(buildable_only=True) if "_tiny_" in r]
    assert len(tiny) >= 10, tiny
    for recipe in tiny:
        binary = build / recipe / f"{recipe}.llmb"
        device, host = (CompiledModel(binary, faithful=f) for f in (True, False))
        want_ids, want = device.generate(PROMPT * 5, 8)
        got_ids, got = host.generate(PROMPT * 5, 8)
        assert got_ids == want_ids and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), recipe
        assert np.array_equal(host.prefill([5, 6, 7]), device.prefill([5, 6, 7])), recipe


def test_a_4bit_decode_step_reads_the_levels_and_keeps_the_device_s_bits(
        build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2-135M w4 (groups of 64): the host's decode steps multiply from the 4-bit levels as stored
    (levels_product, every projection of every step), its prefill from the bf16 copy it caches; the ids and
    logits are the simulated device's, bit for bit."""
    from llmbuild.numerics import levels_product
    from llmbuild.runtime.compiled_model import CompiledModel

    binary = build / "smollm2_135m_w4" / "smollm2_135m_w4.llmb"
    device, host = (CompiledModel(binary, faithful=f) for f in (True, False))
    want_ids, want = device.generate(PROMPT, 4)
    calls: list[tuple[int, ...]] = []
    product = levels_product.product
    monkeypatch.setattr(levels_product, "product", lambda *a, **k: calls.append(a[2].shape) or product(*a, **k))
    got_ids, got = host.generate(PROMPT, 4)
    assert got_ids == want_ids and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert len(calls) >= 3 * 30 * 7 and (576, 288) in calls  # three decode steps, seven projections a layer
    assert any(w is not None for w in host.device._dequantized.values())  # the prefill's bf16 copies


def test_bad_recipe_fails_before_any_work(tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "bad.yaml").write_text(
        "architecture: qwen2\nsource:\n  kind: synthetic\n  config: {model_type: qwen2}\n"
        "stages:\n  seq_length: 16\n  prefill_length: 32\n"
    )
    out = tmp_path / "build"
    r = subprocess.run([sys.executable, "-m", "llmbuild.cli", "prepare", str(recipes / "bad.yaml")], cwd=ROOT,
                       env=_env(out), capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "bad.yaml:7" in r.stderr and "prefill_length" in r.stderr, r.stderr
    assert not out.exists()


def test_long_prompt_runs_in_chunks_through_prefill_kv(build: Path) -> None:
    from llmbuild.runtime.compiled_model import CompiledModel

    model = CompiledModel(build / "llama_tiny_f32" / "llama_tiny_f32.llmb")
    prompt = [int(i) for i in np.random.default_rng(3).integers(3, 500, size=3 * model.L - 5)]
    ids, _ = model.generate(prompt, 12)
    want, _ = hf_generate(build / "llama_tiny_f32" / "checkpoint", prompt, 12)
    assert ids == want
    assert (model.counts.prefill, model.counts.prefill_kv) == (model.L, len(prompt) - model.L)


def test_second_turn_reuses_the_cache_and_matches_transformers(build: Path) -> None:
    from llmbuild.runtime.session import Session

    s = Session(build / "qwen2_tiny_f32" / "qwen2_tiny_f32.llmb")
    first = s.generate(PROMPT, 6)
    second_prompt = [7, 8, 9, 10, 11]
    second = s.generate(second_prompt, 6)
    want, _ = hf_generate(build / "qwen2_tiny_f32" / "checkpoint", PROMPT + first + second_prompt, 6)
    assert second == want
    c = s.model.counts
    assert c.prefill == len(PROMPT) and c.prefill_kv == 1 + len(second_prompt)  # last reply token + turn 2
    assert c.prefill + c.prefill_kv + c.decode == len(s.ids) - 1  # every token once; the last is not fed yet


def test_inspect_reports_nets_memory_map_and_shared_weights(build: Path) -> None:
    r = llmbuild(build, "inspect", "llama_tiny_f16", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    regions = report["memory"]["regions"]
    ordered = sorted(regions.values(), key=lambda x: x["base"])
    for a, b in zip(ordered, ordered[1:], strict=False):
        assert a["base"] + a["bytes"] <= b["base"], "regions overlap"
    assert report["memory"]["total_bytes"] == ordered[-1]["base"] + ordered[-1]["bytes"]
    nets = {n["name"]: n for n in report["nets"]}
    assert len(nets) == 3 + 3 * 4
    for i in range(4):
        stages = [nets[f"block_{i}"], nets[f"block_kv_{i}"], nets[f"block_cache_{i}"]]
        assert len({n["weight_bytes"] for n in stages}) == 1 and stages[0]["weight_bytes"] > 0
    assert report["weight_elements_by_dtype"].keys() == {"f16", "f32"}  # f32: the RoPE tables only

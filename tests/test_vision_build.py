"""The tiny InternVL recipes built as a user builds them: the vit net in the binary, an image's features in
the prompt, and the results checked here against transformers' InternVLForConditionalGeneration, apart from
the build's own checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import build_tiny_internvl_dir, llmbuild, snakemake

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnx")
Image = pytest.importorskip("PIL.Image")

F32, BF16 = "internvl_tiny_f32", "internvl_tiny_bf16"
TEXT = [1, 5, 9, 42]


@pytest.fixture(scope="module")
def built(build_root: Path) -> Path:
    snakemake(build_root, F32, BF16)
    return build_root


def picture(path: Path, seed: int, size: tuple[int, int] = (90, 70)) -> Path:
    """An RGB file of another size than the tower's (the runtime resizes it as InternVL's processor does)."""
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8), "RGB").save(path)
    return path


def reference_ids(build: Path, recipe: str, prompt: list[int], pixels: np.ndarray, steps: int) -> list[int]:
    model = transformers.InternVLForConditionalGeneration.from_pretrained(
        build / recipe / "checkpoint" / "vlm", local_files_only=True).eval()
    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=steps, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt]), pixel_values=torch.from_numpy(pixels),
                             generation_config=config)
    return [int(i) for i in out[0, len(prompt):]]


def test_the_builds_verify_with_an_image(built: Path) -> None:
    f32 = json.loads((built / F32 / "verify.json").read_text())
    assert f32["passed"] and f32["end_to_end_image"]["tokens_equal"]
    vision = json.loads((built / F32 / "vision" / "metrics.json").read_text())
    assert vision["cosine_device"] >= 0.9999 and vision["host_equals_device"] and vision["groups"] >= 1
    bf16 = json.loads((built / BF16 / "verify.json").read_text())
    assert bf16["passed"] and bf16["end_to_end_image"]["first_logits"]["cosine"] >= 0.999
    low = json.loads((built / BF16 / "vision" / "metrics.json").read_text())
    assert 0.999 <= low["cosine_device"] < 0.9999999  # bf16 really: not an f32 net under another name


def test_session_with_an_image_file_gives_transformers_ids_on_both_executors(built: Path, tmp_path: Path) -> None:
    from llmbuild.runtime.session import Session

    image = picture(tmp_path / "a.png", 1)  # 70 wide, 90 high: a 2 x 2 grid and the thumbnail (max_tiles 4)
    results = {}
    for faithful in (False, True):
        session = Session(built / F32 / f"{F32}.llmb", faithful=faithful, ignore_eos=True, max_new_tokens=12)
        prompt = session.image_ids(image) + TEXT
        results[faithful] = session.generate(prompt, images=[image])
    pixels = session.image_pixels([image])[0]
    assert len(pixels) == 5 and prompt.count(session.model.vision.meta["image_token_id"]) == 5 * 4
    assert results[False] == results[True] == reference_ids(built, F32, prompt, pixels, 12)


def test_the_image_changes_the_reply_and_several_images_work(built: Path, tmp_path: Path) -> None:
    from llmbuild.runtime.session import Session

    session = Session(built / F32 / f"{F32}.llmb", ignore_eos=True, max_new_tokens=12)
    replies = []
    for image in (picture(tmp_path / "a.png", 1), picture(tmp_path / "b.png", 2)):
        session.reset()
        replies.append(session.generate(session.image_ids(image) + TEXT, images=[image]))
    assert replies[0] != replies[1]
    # Two images in one prompt (one tiled, one square: a single tile), each at its own run of image tokens,
    # against transformers with both images' tiles.
    two = [picture(tmp_path / "a.png", 1), picture(tmp_path / "c.png", 3, (56, 56))]
    prompt = session.image_ids(two[0]) + session.image_ids(two[1]) + TEXT
    session.reset()
    got = session.generate(prompt, images=two)
    assert got == reference_ids(built, F32, prompt, np.concatenate(session.image_pixels(two)), 12)


def test_chat_turns_with_images_reuse_the_cache(built: Path, tmp_path: Path) -> None:
    from llmbuild.runtime.session import Session

    session = Session(built / F32 / f"{F32}.llmb", max_new_tokens=2)  # two turns in the tiny S = 64
    square = (56, 56)  # one tile each
    first = session.send("a", images=[picture(tmp_path / "a.png", 1, square)])
    before = dict(session.stats)
    second = session.send("b", images=[picture(tmp_path / "b.png", 2, square)])
    assert isinstance(first, str) and isinstance(second, str)
    # The second turn prefilled only its own tokens on top of the cached first turn (image rows included).
    assert session.stats["prefill"] == before["prefill"] and session.stats["prefill_kv"] > before["prefill_kv"]
    assert len(session.features) == 2


def test_dropping_old_turns_drops_their_images(built: Path, tmp_path: Path) -> None:
    from llmbuild.runtime.session import Session

    session = Session(built / F32 / f"{F32}.llmb", policy="drop_oldest", max_new_tokens=4, ignore_eos=True)
    square = (56, 56)
    dropped = 0
    for turn in range(8):  # one-tile images: each turn about 20 of the tiny S = 64 tokens
        session.send(f"turn {turn}", images=[picture(tmp_path / f"{turn}.png", turn, square)])
        dropped += session.last_reply.dropped_turns
        # Every image still in the conversation has its rows, and only those.
        runs = session.ids.count(session.model.vision.meta["image_token_id"]) // session.model.vision.tokens
        assert len(session.features) == runs >= 1
    assert dropped >= 1
    # The kept conversation still gives the ids a fresh session gets for it (the newest image's rows at
    # its own tokens, not an older image's).
    fresh = Session(built / F32 / f"{F32}.llmb", ignore_eos=True, max_new_tokens=4)
    prompt = session.ids[: len(session.ids) - len(session.last_reply.ids)]
    images = [picture(tmp_path / f"{turn}.png", turn, square) for turn in range(8 - runs, 8)]
    assert fresh.generate(prompt, images=images) == session.last_reply.ids


def test_run_image_command_line(built: Path, tmp_path: Path) -> None:
    image = picture(tmp_path / "a.png", 1)
    r = llmbuild(built, "run", F32, "--image", str(image), "--prompt", "describe", "--max-new-tokens", "4", "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["ids"]) >= 1
    bad = llmbuild(built, "run", F32, "--image", str(tmp_path / "missing.png"), "--prompt", "x")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "image file not found" in bad.stderr
    (tmp_path / "not.png").write_text("text")
    bad = llmbuild(built, "run", F32, "--image", str(tmp_path / "not.png"), "--prompt", "x")
    assert bad.returncode == 2 and "not an image" in bad.stderr and "Traceback" not in bad.stderr


def test_inspect_and_perf_show_the_vit_net(built: Path) -> None:
    r = llmbuild(built, "inspect", F32, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    vit = [n for n in report["nets"] if n["name"] == "vit"]
    assert len(vit) == 1 and vit[0]["groups"] and vit[0]["ops"].get("FAttention") == 2
    assert "vision" in report["memory"]
    perf = json.loads((built / F32 / "perf.json").read_text())
    assert 0 < perf["vision_encode_s"] < perf["first_token_latency_with_image_s"]


def test_estimate_reports_the_vision_tower_per_tile() -> None:
    from llmbuild.families.internvl.cost import vision_estimate

    r = llmbuild(Path("/nonexistent"), "estimate", F32, "--json")
    assert r.returncode == 0, r.stderr
    vision = json.loads(r.stdout)["vision"]
    assert vision["vision_encode_s"] > 0 and vision["vision_tokens_per_tile"] == 4 and vision["image_size"] == 56
    # InternViT-300M at 448 px (1025 tokens, width 1024, 24 layers, MLP 4096) with a 1536-wide language model:
    # about 0.7 TFLOP a tile, and the work grows with the layers.
    big = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "image_size": 448,
           "patch_size": 14}
    one = vision_estimate(big, 1536, "bf16", "bm1684x")
    assert 0.6e12 < one["vision_flops"] < 0.8e12 and one["vision_tokens_per_tile"] == 256
    two = vision_estimate({**big, "num_hidden_layers": 48}, 1536, "bf16", "bm1684x")
    assert 1.9 < two["vision_flops"] / one["vision_flops"] < 2.0 and two["vision_encode_s"] > one["vision_encode_s"]
    # The real-size recipe, without its weights: the tower from the shipped config.json
    r = llmbuild(Path("/nonexistent"), "estimate", "internvl3_2b_w4", "--json", env={"LLMBUILD_MODELS": "/nonexistent"})
    assert r.returncode == 0, r.stderr
    real = json.loads(r.stdout)
    assert real["vision"]["vision_tokens_per_tile"] == 256 and real["vision"]["image_size"] == 448
    assert real["vision"]["vision_flops"] == pytest.approx(one["vision_flops"], rel=1e-9)


def test_internvl_from_a_hugging_face_directory(built: Path, tmp_path: Path) -> None:
    """The same model as a directory transformers would save (`language_model.model.*`, `vision_tower.*`: the
    layout the published native checkpoints have), read by an hf recipe: the language model through its
    vision-language names, the tower exported from the directory itself."""
    import shutil

    from safetensors.numpy import load_file, save_file

    source = built / F32 / "checkpoint" / "vlm"
    hf = tmp_path / "InternVL-tiny"
    hf.mkdir()
    renamed = {}
    for key, value in load_file(str(source / "model.safetensors")).items():
        key = key.replace("model.language_model.", "language_model.model.", 1).replace("model.vision_tower.",
                                                                                     "vision_tower.", 1)
        renamed[key.replace("model.multi_modal_projector.", "multi_modal_projector.", 1)] = value
    save_file(renamed, str(hf / "model.safetensors"), metadata={"format": "pt"})
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(source / name, hf / name)
    build = build_tiny_internvl_dir(tmp_path, hf, "internvl_hf")
    report = json.loads((build / "internvl_hf" / "verify.json").read_text())
    assert report["passed"] and report["end_to_end"]["tokens_equal"] and report["end_to_end_image"]["tokens_equal"]
    # `llmbuild compile DIR` writes the same kind of recipe for the directory: the tower is seen
    from llmbuild.steps.oneshot import CompileRequest, recipe_for

    _, text = recipe_for(CompileRequest(hf, tmp_path / "out", "f32", "bm1684x", 64, 16))
    assert 'vision: {"family": "internvl"}' in text and 'architecture: "qwen2"' in text
    # the same weights: the same binary's programs and weights as the synthetic build's
    f32_e2e = json.loads((built / F32 / "e2e.json").read_text())
    hf_e2e = json.loads((build / "internvl_hf" / "e2e.json").read_text())
    assert hf_e2e["image"]["ids"] == f32_e2e["image"]["ids"] and hf_e2e["ids"] == f32_e2e["ids"]


def test_a_failing_vision_check_is_one_line_and_imports_the_tower_again_to_say_where(tmp_path: Path) -> None:
    """The checks run without the tower's float weights; a check that fails (bf16 cannot reach cosine 1) imports
    them again to look for the first op that parts, and the step ends in one line naming the field."""
    import shutil

    from helpers import ROOT

    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", recipes)
    (recipes / "internvl_tiny_strict.yaml").write_text(f"base: {BF16}\nvision:\n  image_cosine: 1.0\n")
    out = tmp_path / "build"
    target = str(out / "internvl_tiny_strict" / "vision" / "vision.llmo")
    result = snakemake(out, target, recipes=recipes, check=False)
    assert result.returncode != 0
    log = (out / "internvl_tiny_strict" / "logs" / "vision.log").read_text().strip().splitlines()[-1]
    assert "vision.image_cosine: the vit net's image features have cosine 0.99" in log, log
    assert "expected at least 1.0" in log
    assert not (out / "internvl_tiny_strict" / "vision" / "vision.llmo").exists()
    assert not [p for p in (out / "internvl_tiny_strict" / "vision").iterdir() if p.name.startswith("onnx__")]

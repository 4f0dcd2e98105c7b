"""MiniCPM-V 2.6 read from a checkpoint directory, as `minicpm_v_2_6_w4` reads the published one: the tiny model
laid out as openbmb/MiniCPM-V-2_6 is (`llm.model.*` with an untied `llm.lm_head.weight`, `vpm.*`,
`resampler.*`, sharded with a model.safetensors.index.json, the Qwen2 fields at config.json's top level),
built by `llmbuild compile DIR`; the streamed image reference (one decoder layer at a time) against the
whole-model torch reference; a directory missing a tensor refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import llmbuild, snakemake

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnx")

RECIPE = "minicpmv_tiny_f32"
FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


@pytest.fixture(scope="module")
def vlm(build_root: Path) -> Path:
    snakemake(build_root, RECIPE)
    return build_root / RECIPE / "checkpoint" / "vlm"


def published_layout(vlm: Path, out: Path, drop: str | None = None, truncate: str | None = None) -> Path:
    """The tiny checkpoint as MiniCPM-V 2.6 is published: lm_head untied (a copy of the embeddings, so the
    model is the same), the language model and the vision path in two shards listed by an index. `drop`: a
    tensor left out; `truncate`: one stored without its last row."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(vlm / "model.safetensors"))
    tensors["llm.lm_head.weight"] = tensors["llm.model.embed_tokens.weight"].copy()
    if drop is not None:
        del tensors[drop]
    if truncate is not None:
        tensors[truncate] = tensors[truncate][:-1].copy()
    config = json.loads((vlm / "config.json").read_text())
    config["tie_word_embeddings"] = False
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    shards = {"model-00001-of-00002.safetensors": {k: v for k, v in tensors.items() if k.startswith("llm.")},
              "model-00002-of-00002.safetensors": {k: v for k, v in tensors.items() if not k.startswith("llm.")}}
    weight_map = {}
    for shard, part in shards.items():
        save_file(part, str(out / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    total = sum(v.nbytes for v in tensors.values())
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}))
    for name in FILES:
        shutil.copyfile(vlm / name, out / name)
    return out


def test_the_streamed_image_reference_equals_the_whole_model(vlm: Path, tmp_path: Path) -> None:
    """The tower's layers and the language model streamed, the latter over the published layout's `llm.*`
    names (HFWeights), the pieces of three grids in the prompt: the same ids and logits as the whole-model
    reference (Idefics2 tower, resampler, Qwen2ForCausalLM) on the synthetic files."""
    from llmbuild.families.minicpmv.reference import reference_generate
    from llmbuild.families.minicpmv.stream import streamed_image_generate, streamed_vision
    from llmbuild.verify.stream_weights import HFWeights

    hf = published_layout(vlm, tmp_path / "MiniCPM-V-tiny")
    rng = np.random.default_rng(7)
    pieces = [rng.uniform(-1, 1, (3, 14 * h, 14 * w)).astype(np.float32) for h, w in ((3, 3), (2, 4), (3, 2))]
    image = 11  # any id: its rows are replaced
    prompt = [1, 5] + [image] * 4 + [9] + [image] * 8 + [42, 3]
    tower, _, _ = streamed_vision(hf)  # no encoder layer held: each is made from the files as it runs
    assert not [name for name, _ in tower.named_parameters() if "layers" in name]
    weights = HFWeights(hf)
    assert not weights.config.tie_word_embeddings and weights.config.model_type == "qwen2"
    ids, logits = streamed_image_generate(weights, hf, prompt, pieces, image, 8)
    whole, first = reference_generate(vlm, prompt, pieces, image, 8)
    assert ids == whole and len(ids) == 8
    np.testing.assert_array_equal(logits[0], first)  # to the bit (measured: equal)
    # The image matters: without its rows (the placeholder's own embeddings) the run differs.
    plain, _ = streamed_image_generate(weights, hf, [1, 5, 9, 42, 3], [], image, 8)
    assert plain != ids
    with pytest.raises(Exception, match="image token rows"):
        streamed_image_generate(weights, hf, prompt, pieces[:2], image, 1)


def test_compile_a_minicpmv_directory(vlm: Path, tmp_path: Path) -> None:
    """`llmbuild compile DIR` of the published layout: a recipe with vision.family minicpmv, a binary whose
    image run gives the whole-model torch reference's greedy ids (and the streamed one's, in e2e)."""
    from llmbuild.families.minicpmv.reference import reference_generate
    from llmbuild.runtime.session import Session

    hf = published_layout(vlm, tmp_path / "MiniCPM-V-tiny")
    out = tmp_path / "minicpmv_hf"
    r = llmbuild(tmp_path, "compile", str(hf), "--quantize", "f32", "--seq-length", "128", "--prefill-length", "32",
                 "-o", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    recipe = (out / "minicpmv_hf.yaml").read_text()
    assert 'vision: {"family": "minicpmv"}' in recipe and 'architecture: "qwen2"' in recipe
    report = json.loads((out / "verify.json").read_text())
    assert report["passed"] and report["end_to_end"]["tokens_equal"] and report["end_to_end_image"]["tokens_equal"]
    image = json.loads((out / "e2e.json").read_text())["image"]
    assert image["slices"] == 2 and image["first_logits"]["cosine"] >= 0.9999
    session = Session(out / "minicpmv_hf.llmb")
    sliced = session.model.vision.pixels(out / "vision" / "test_image.png")
    assert image["prompt_ids"][: len(session.image_ids(sliced))] == session.image_ids(sliced)
    whole, _ = reference_generate(vlm, image["prompt_ids"], list(sliced.pieces),
                                  session.model.vision.meta["image_token_id"], len(image["ids"]))
    assert image["ids"] == whole and len(whole) >= 4


def test_a_minicpmv_directory_missing_a_tensor_is_a_one_line_error(vlm: Path, tmp_path: Path) -> None:
    """`llmbuild prepare` of an hf recipe refuses it in one line naming the index and the tensor as stored;
    the language model's tensors through the ordinary scan, the vision path's through the MiniCPM-V check."""
    from llmbuild import LlmbuildError
    from llmbuild.families.minicpmv.checkpoint import check_vision_tensors
    from llmbuild.frontend.checkpoint_scan import scan_checkpoint
    from llmbuild.frontend.hf import HFSource

    hf = published_layout(vlm, tmp_path / "broken", drop="vpm.encoder.layers.1.mlp.fc1.weight")
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "minicpmv_broken.yaml").write_text(
        "description: a MiniCPM-V directory missing a tensor\narchitecture: qwen2\nsource:\n  kind: hf\n"
        f"  path: {hf}\nvision:\n  family: minicpmv\nquantization:\n  mode: f32\ntarget:\n  chip: bm1684x\n"
        "stages:\n  seq_length: 128\n  prefill_length: 32\n")
    r = llmbuild(tmp_path / "build", "prepare", "minicpmv_broken", env={"LLMBUILD_RECIPES": str(recipes)})
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert f"{hf / 'model.safetensors.index.json'}: missing tensor 'vpm.encoder.layers.1.mlp.fc1.weight'" in r.stderr
    assert not (tmp_path / "build" / "minicpmv_broken" / "spec.json").exists()
    for i, drop in enumerate(("llm.model.layers.1.mlp.up_proj.weight", "llm.lm_head.weight",
                              "resampler.kv_proj.weight")):
        hf = published_layout(vlm, tmp_path / str(i), drop=drop)
        source = HFSource(hf)
        with pytest.raises(LlmbuildError, match=f"index.json: missing tensor '{drop}'"):
            scan_checkpoint(source)
            check_vision_tensors(hf, source.entries())
    hf = published_layout(vlm, tmp_path / "short", truncate="resampler.proj")
    with pytest.raises(LlmbuildError, match=r"model-00002-of-00002.safetensors: tensor 'resampler.proj' has shape "
                                            r"\[255, 256\], expected \[256, 256\] from config.json"):
        check_vision_tensors(hf, HFSource(hf).entries())


def test_the_vision_tensors_prepare_expects_are_the_torch_modules(vlm: Path) -> None:
    """Prepare works the `vpm.*`/`resampler.*` shapes out of config.json without torch; they are the state dicts
    of the modules the vision step loads (built on the meta device), for the tiny and the published config."""
    from helpers import ROOT

    from llmbuild.families.minicpmv.checkpoint import expected_vision_shapes
    from llmbuild.families.minicpmv.synthetic import vision_shapes

    for path in (vlm / "config.json", ROOT / "recipes" / "configs" / "minicpm_v_2_6.json"):
        cfg = json.loads(path.read_text())
        assert expected_vision_shapes(cfg) == vision_shapes(cfg), path
    published = expected_vision_shapes(json.loads((ROOT / "recipes/configs/minicpm_v_2_6.json").read_text()))
    assert published["vpm.embeddings.position_embedding.weight"] == (4900, 1152)
    assert published["resampler.kv_proj.weight"] == (3584, 1152) and len(published) == 27 * 16 + 5 + 13

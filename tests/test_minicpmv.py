"""MiniCPM-V 2.6 (tiny, f32) built as a user builds it: one static vit net for slices of every size, images
sliced as the model slices them, and greedy ids checked here against the torch reference (transformers'
Idefics2 tower at each piece's own size, the published resampler, Qwen2ForCausalLM), apart from the build's
own checks. The slicing is checked against transformers' MiniCPM-V image processor, the tower's position ids
against transformers' own embedding code."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import llmbuild, snakemake

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnx")
Image = pytest.importorskip("PIL.Image")

RECIPE = "minicpmv_tiny_f32"
TEXT = [1, 5, 9, 42]


@pytest.fixture(scope="module")
def built(build_root: Path) -> Path:
    snakemake(build_root, RECIPE)
    return build_root


def picture(path: Path, seed: int, size: tuple[int, int]) -> Path:
    """An RGB file of `size` (height, width): smooth gradients and noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0 : size[0], 0 : size[1]] / max(size)
    rgb = np.stack([x, y, 1 - x * y], axis=-1) * 200 + rng.integers(0, 56, (*size, 3))
    Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB").save(path)
    return path


def reference(built: Path, prompt: list[int], sliced: list, steps: int) -> list[int]:
    from llmbuild.families.minicpmv.reference import reference_generate
    from llmbuild.runtime.session import Session

    meta = Session(built / RECIPE / f"{RECIPE}.llmb").model.vision.meta
    pieces = [p for image in sliced for p in image.pieces]
    ids, _ = reference_generate(built / RECIPE / "checkpoint" / "vlm", prompt, pieces, meta["image_token_id"], steps)
    return ids


def test_the_build_verifies_with_a_sliced_image(built: Path) -> None:
    report = json.loads((built / RECIPE / "verify.json").read_text())
    assert report["passed"] and report["end_to_end_image"]["tokens_equal"]
    e2e = json.loads((built / RECIPE / "e2e.json").read_text())["image"]
    assert e2e["slices"] == 2 and len(e2e["ids"]) == 32 and e2e["first_logits"]["cosine"] >= 0.9999
    vision = json.loads((built / RECIPE / "vision" / "metrics.json").read_text())
    assert vision["host_equals_device"] and len(vision["cases"]) >= 4
    assert min(c["device"] for c in vision["cases"].values()) >= 0.9999


def test_images_that_slice_differently_give_the_reference_ids(built: Path, tmp_path: Path) -> None:
    from llmbuild.runtime.session import Session

    small = picture(tmp_path / "small.png", 1, (20, 40))  # less than a slice: one piece of 4 x 2 patches
    large = picture(tmp_path / "large.png", 2, (40, 120))  # an overview of 5 x 2 patches, 3 x 1 slices of 3 x 3
    results = {}
    for faithful in (False, True):  # the host path and the simulated device
        session = Session(built / RECIPE / f"{RECIPE}.llmb", faithful=faithful, ignore_eos=True, max_new_tokens=6)
        for name, image in (("small", small), ("large", large)):
            session.reset()
            results[faithful, name] = session.generate(session.image_ids(image) + TEXT, images=[image])
    sliced = {name: session.image_pixels([image])[0] for name, image in (("small", small), ("large", large))}
    assert sliced["small"].grid is None and len(sliced["small"]) == 1
    assert sliced["large"].grid == (3, 1) and len(sliced["large"]) == 4
    # Three piece sizes through the one static net.
    assert {p.shape for p in [*sliced["small"].pieces, *sliced["large"].pieces]} == {
        (3, 28, 56), (3, 28, 70), (3, 42, 42)}
    for name in ("small", "large"):
        prompt = session.image_ids(sliced[name]) + TEXT
        assert results[False, name] == results[True, name] == reference(built, prompt, [sliced[name]], 6)
    assert results[False, "small"] != results[False, "large"]


def test_two_images_in_one_prompt_and_in_a_chat(built: Path, tmp_path: Path) -> None:
    from llmbuild.runtime.session import Session

    images = [picture(tmp_path / "a.png", 3, (70, 90)), picture(tmp_path / "b.png", 4, (40, 30))]
    session = Session(built / RECIPE / f"{RECIPE}.llmb", ignore_eos=True, max_new_tokens=6)
    sliced = session.image_pixels(images)
    prompt = session.image_ids(sliced[0], 0) + session.image_ids(sliced[1], 1) + TEXT
    assert session.generate(prompt, images=images) == reference(built, prompt, sliced, 6)
    meta = session.model.vision.meta
    # The placeholders as MiniCPM-V's processor writes them: <image_id>1</image_id>, the overview's run, the
    # slices' runs (a grid's rows apart by a new line).
    ids = session.image_ids(sliced[0], 1)
    assert ids[0] == meta["image_id_start_id"] and meta["image_start_id"] in ids
    assert ids.count(meta["slice_start_id"]) == 4 and ids.count(meta["image_token_id"]) == 5 * 4
    chat = Session(built / RECIPE / f"{RECIPE}.llmb", max_new_tokens=2)
    assert isinstance(chat.send("what is it", images=images[1:]), str) and len(chat.features) == 1


def test_run_with_an_image_and_bad_inputs(built: Path, tmp_path: Path) -> None:
    from llmbuild import LlmbuildError
    from llmbuild.runtime.session import Session

    image = picture(tmp_path / "a.png", 1, (70, 90))
    r = llmbuild(built, "run", RECIPE, "--image", str(image), "--prompt", "describe", "--max-new-tokens", "3",
                 "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["ids"]) >= 1
    strip = picture(tmp_path / "strip.png", 1, (1, 4000))  # its slices have more patches than the net holds
    bad = llmbuild(built, "run", RECIPE, "--image", str(strip), "--prompt", "x")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "more than the vit net's" in bad.stderr
    session = Session(built / RECIPE / f"{RECIPE}.llmb")
    with pytest.raises(LlmbuildError, match="MiniCPM-V binary takes image files"):
        session.image_pixels([np.zeros((3, 42, 42), np.float32)])


def test_slicing_equals_transformers_minicpmv_processor() -> None:
    """Grid, overview size and refined size against transformers' MiniCPM-V 4.6 PIL processor, whose slicing
    is 2.6's but for two things this maps or avoids: it rounds sides to patch x merge (patch 7 with its "4x"
    merge of 2 is MiniCPM-V 2.6's 14), and it breaks a tie in the grid error towards more rows (2.6 keeps the
    first grid: ties are skipped here and checked on their own)."""
    from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil

    from llmbuild.families.minicpmv.inputs import best_resize
    from llmbuild.families.minicpmv.runtime import refine_size, slice_grid

    proc = MiniCPMV4_6ImageProcessorPil()
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(400):
        w, h = (int(v) for v in rng.integers(20, 2000, 2))
        scale = int(rng.choice([448, 42, 224]))
        ours = slice_grid((w, h), scale, 9)
        theirs = proc.get_sliced_grid((h, w), 9, scale)
        if theirs is not None:
            multiple = min(math.ceil(w * h / scale**2), 9)
            errors = sorted(abs(math.log(w / h) - math.log(c / (n // c))) for n in range(multiple - 1, multiple + 2)
                            if 1 < n <= 9 for c in range(1, n + 1) if n % c == 0)
            if errors[0] == errors[1]:
                continue  # a tie: the two processors may differ by design
        assert ours == (None if theirs is None else (theirs[1], theirs[0])), (w, h, scale)
        up = ours is None
        assert best_resize((w, h), scale, 14, up)[::-1] == proc.find_best_resize((h, w), scale, 7, "4x", up)
        if ours is not None:
            want = proc.get_refine_size((h, w), [ours[1], ours[0]], scale, 7, "4x", True)
            assert refine_size((w, h), ours, scale, 14)[::-1] == want
            checked += 1
    assert checked > 100
    # A square of two slices' area: (1, 2) and (2, 1) tie; 2.6 keeps the first (one column, two rows).
    assert slice_grid((55, 55), 42, 9) == (1, 2)


def test_position_ids_equal_transformers_embeddings() -> None:
    """The host's position ids are what transformers' Idefics2 embeddings compute from a patch mask (its
    position table made an index table, its patch embedding zero), for every side length at the real table."""
    from transformers import Idefics2VisionConfig
    from transformers.models.idefics2.modeling_idefics2 import Idefics2VisionEmbeddings

    from llmbuild.families.minicpmv.inputs import position_ids

    # At the real 70-wide table every side length, each beside the shortest and the longest other side.
    every = [(h, w) for n in range(1, 71) for h, w in ((n, 1), (1, n), (n, 70), (70, n))]
    for side, grids in ((4, [(1, 1), (3, 3), (3, 4), (5, 2)]), (70, [(32, 32), (23, 45), (33, 31), *every])):
        emb = Idefics2VisionEmbeddings(Idefics2VisionConfig(hidden_size=1, image_size=side * 2, patch_size=2))
        with torch.no_grad():
            emb.patch_embedding.weight.zero_()
            emb.patch_embedding.bias.zero_()
            emb.position_embedding.weight.copy_(torch.arange(side * side, dtype=torch.float32)[:, None])
            for h, w in grids:
                got = emb(torch.zeros(1, 3, 2 * h, 2 * w), torch.ones(1, h, w, dtype=torch.bool))
                assert np.array_equal(got[0, :, 0].numpy().astype(np.int64), position_ids(h, w, side)), (side, h, w)


def test_sincos_table_equals_the_published_formula_in_float64() -> None:
    """The resampler keys' 2-D sin-cos table against its definition evaluated apart in float64."""
    from llmbuild.numerics.sincos import sincos_2d

    dim, h, w = 16, 3, 5
    table = sincos_2d(dim, h, w)
    quarter = dim // 4
    omega = 1.0 / 10000 ** (np.arange(quarter, dtype=np.float64) / quarter)
    for r in range(h):
        for c in range(w):
            want = np.concatenate([np.sin(c * omega), np.cos(c * omega), np.sin(r * omega), np.cos(r * omega)])
            assert np.allclose(table[r, c], want, atol=1e-6)


def test_the_bmodel_vit_inputs_are_the_llmb_s_piece_in_the_vendor_s_layout() -> None:
    """The bmodel's vit net takes each piece as LLM-TPU's MiniCPM-V pipeline feeds it: its patches one row each
    (pipeline.py: `pixel_value.reshape(3, 14, -1, 14).transpose(2, 0, 1, 3)` of the processor's layout, which
    slice_inputs writes) and row * side + column into the side x side sin-cos table, whose rows are the
    .llmb's sin-cos rows bit for bit; the tower's ids and both masks are the .llmb's. A piece wider than the
    table is one line naming the image."""
    from llmbuild import LlmbuildError
    from llmbuild.families.minicpmv.inputs import VENDOR_INPUTS, slice_inputs, vendor_inputs
    from llmbuild.numerics.sincos import sincos_2d

    p, capacity, side, queries, dim = 14, 12, 4, 4, 32
    table = sincos_2d(dim, side, side).reshape(side * side, dim)
    rng = np.random.default_rng(9)
    for h, w in ((1, 1), (3, 3), (2, 4), (4, 2), (3, 4)):
        piece = rng.standard_normal((3, h * p, w * p)).astype(np.float32)
        llmb = slice_inputs(piece, p, capacity, side, queries, dim)
        vendor = dict(zip(VENDOR_INPUTS, vendor_inputs(piece, p, capacity, side, queries), strict=True))
        rows = llmb["pixel_values"][0].reshape(3, p, -1, p).transpose(2, 0, 1, 3).reshape(-1, 3 * p * p)
        assert vendor["input_states"].dtype == np.float32 and np.array_equal(vendor["input_states"], rows)
        assert vendor["pos_ids"].dtype == np.int32 and np.array_equal(vendor["pos_ids"], llmb["position_ids"][0])
        assert np.array_equal(vendor["attn_mask"], llmb["attention_mask"])
        assert np.array_equal(vendor["resampler_attn_mask"], llmb["resampler_mask"])
        ids = vendor["pos_embed_ids"]
        assert ids.dtype == np.int32 and np.array_equal(table[ids[: h * w]], llmb["pos_embed"][0, : h * w])
    with pytest.raises(LlmbuildError, match=r"^wide.png: a piece of 5x1 patches: the bmodel's vit net takes pieces "
                                            r"of at most 4 patches a side") as err:
        vendor_inputs(np.zeros((3, p, 5 * p), np.float32), p, capacity, side, queries, "wide.png")
    assert "\n" not in str(err.value)


def test_the_vit_net_exports_to_the_vendor_s_top_dialect_with_its_runtime_s_inputs(built: Path, tmp_path: Path) -> None:
    """The vit TopOp net (the vision step's import) written as the vendor's module: llm_convert's MiniCPM-V
    inputs in its order and types, the pixels' reshape-permute-reshape replaced by the patch-row input, the
    sin-cos table a weight gathered by pos_embed_ids, attention spelled out with both masks; a TopOp net
    with other inputs is one line naming the net. (tests/test_bmodel_build.py compiles and runs it.)"""
    from xdsl.dialects.builtin import StringAttr

    from llmbuild import LlmbuildError
    from llmbuild.families.minicpmv.model import export_onnx
    from llmbuild.families.minicpmv.vendor import POS_TABLE, export_vit
    from llmbuild.frontend.onnx_model import load_onnx
    from llmbuild.importer.onnx_net import import_onnx_net
    from llmbuild.numerics.sincos import sincos_2d

    vlm = built / RECIPE / "checkpoint" / "vlm"
    net = import_onnx_net(load_onnx(export_onnx(vlm, tmp_path / "vit.onnx")), "vit")
    vendor = export_vit(net.module, net.weights, "vit_top_weights.npz", vlm)
    assert [(name, tuple(shape), element) for name, shape, element in vendor.args] == [
        ("input_states", (12, 588), "f32"), ("pos_ids", (12,), "si32"), ("attn_mask", (1, 1, 12, 12), "f32"),
        ("pos_embed_ids", (12,), "si32"), ("resampler_attn_mask", (1, 1, 4, 12), "f32")]
    text = vendor.text()
    assert "-> tensor<4x256xf32>" in text and 'loc("image_tokens")' in text
    assert "order = [0, 2, 4, 1, 3, 5]" not in text and "top.FAttention" not in text
    assert text.count('"top.Softmax"') == 3 and text.count("loc(\"attn_mask\")") == 1
    assert np.array_equal(vendor.weights[POS_TABLE], sincos_2d(256, 4, 4).reshape(16, 256))
    (keys,) = [op for op in net.module.walk() if op.name == "top.Input" and op.attributes["loc"].data == "pos_embed"]
    keys.attributes["loc"] = StringAttr("sincos")  # a net whose inputs are not the static net's
    with pytest.raises(LlmbuildError, match=r"^net vit: inputs \[.*'sincos'.*\]: expected MiniCPM-V's static vit "
                                            r"net's") as err:
        export_vit(net.module, net.weights, "vit_top_weights.npz", vlm)
    assert "\n" not in str(err.value)


def test_legacy_and_dynamo_exports_import_to_the_same_outputs(built: Path, tmp_path: Path) -> None:
    from llmbuild.dialects.interpret import interpret
    from llmbuild.families.minicpmv.family import vit_geometry
    from llmbuild.families.minicpmv.inputs import slice_inputs
    from llmbuild.families.minicpmv.model import export_onnx, load_vision, reference_features
    from llmbuild.frontend.onnx_model import load_onnx
    from llmbuild.importer.onnx_net import import_onnx_net
    from llmbuild.verify.similarity import cosine

    vlm = built / RECIPE / "checkpoint" / "vlm"
    tower, resampler, cfg = load_vision(vlm)
    geo = vit_geometry(cfg)
    piece = np.random.default_rng(5).standard_normal((3, 2 * 14, 5 * 14)).astype(np.float32)
    inputs = slice_inputs(piece, 14, geo["max_patches"], geo["side"], geo["queries"], geo["embed_dim"])
    want = reference_features(tower, resampler, piece)
    outs = {}
    for exporter in ("legacy", "dynamo"):
        net = import_onnx_net(load_onnx(export_onnx(vlm, tmp_path / f"{exporter}.onnx", exporter)), "vit")
        ops = [op.name for op in net.module.walk()]
        assert ops.count("top.GELUTanh") == cfg["vision_config"]["num_hidden_layers"] and "top.Gather" in ops
        assert ops.count("top.FAttention") == cfg["vision_config"]["num_hidden_layers"] + 1
        run = interpret(net.module, inputs, net.weights.__getitem__, reference=True)
        outs[exporter] = run.outputs["image_features"]
        assert cosine(outs[exporter][0], want) >= 0.99999
    assert np.allclose(outs["legacy"], outs["dynamo"], atol=1e-5)


def test_a_tanh_outside_gelu_is_a_one_line_error(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    from llmbuild import LlmbuildError
    from llmbuild.frontend.onnx_model import load_onnx
    from llmbuild.importer.onnx_net import import_onnx_net

    graph = helper.make_graph([helper.make_node("Tanh", ["x"], ["y"], name="lonely")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "t.onnx")
    with pytest.raises(LlmbuildError, match=r"node lonely \(Tanh\): Tanh outside the tanh GELU") as err:
        import_onnx_net(load_onnx(tmp_path / "t.onnx"), "vit")
    assert "\n" not in str(err.value)


def test_the_vision_flops_equal_torch_s_count_of_the_exported_module(built: Path) -> None:
    """The estimate's flops per slice against torch's own FLOP counter on the module the vit net is exported
    from (which also projects the constant queries, 2 Q E^2, that the import folds away)."""
    from torch.utils.flop_counter import FlopCounterMode

    from llmbuild.families.minicpmv.cost import vit_flops
    from llmbuild.families.minicpmv.family import STATIC_INPUTS, vit_geometry
    from llmbuild.families.minicpmv.inputs import slice_inputs
    from llmbuild.families.minicpmv.model import static_vision

    vlm = built / RECIPE / "checkpoint" / "vlm"
    module, cfg = static_vision(vlm)
    geo = vit_geometry(cfg)
    inputs = slice_inputs(np.zeros((3, 14, 14), np.float32), 14, geo["max_patches"], geo["side"], geo["queries"],
                          geo["embed_dim"])
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        module(*(torch.from_numpy(inputs[name]) for name in STATIC_INPUTS))
    vc = cfg["vision_config"]
    flops, _ = vit_flops(vc["hidden_size"], vc["intermediate_size"], vc["num_hidden_layers"], geo["patch"],
                         geo["max_patches"], geo["queries"], geo["embed_dim"])
    assert counter.get_total_flops() == flops + 2 * geo["queries"] * geo["embed_dim"] ** 2


def test_the_real_size_estimate_reports_the_vision_encode_per_slice_and_image() -> None:
    """minicpm_v_2_6_w4 without its weights: the shipped config.json gives Qwen2-7B's first token and decode
    speed, and SigLIP-400M with the resampler per slice (1366 patches: the most a 448 px slice has) and per
    image (the overview and 9 slices)."""
    no_weights = {"LLMBUILD_MODELS": "/nonexistent"}
    r = llmbuild(Path("/nonexistent"), "estimate", "minicpm_v_2_6_w4", "--json", env=no_weights)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    vision = report["vision"]
    assert vision["vision_patches_per_slice"] == 1366 and vision["vision_tokens_per_tile"] == 64
    assert vision["vision_pieces_per_image"] == 10
    assert vision["vision_encode_image_s"] == pytest.approx(10 * vision["vision_encode_s"])
    assert 0.01 < vision["vision_encode_s"] < 2.0
    # Qwen2-7B's 28 layers read from the top level of MiniCPM-V's config, next to the vision time.
    assert 7.0e9 < report["params"] < 8.5e9
    assert report["first_token_latency_s"] > 0 and report["decode_tokens_per_s"] > 0
    text = llmbuild(Path("/nonexistent"), "estimate", "minicpm_v_2_6_w4", env=no_weights)
    assert text.returncode == 0 and "ms per slice of up to 1366 patches" in text.stdout


def test_the_tanh_gelu_kernel_equals_torch() -> None:
    """tpu.Active mode GELU_TANH (and top.GELUTanh) against torch's gelu(approximate="tanh"), SigLIP's."""
    from llmbuild.numerics.kernels import ACTIVATIONS

    x = np.linspace(-8, 8, 4001, dtype=np.float32)
    want = torch.nn.functional.gelu(torch.from_numpy(x), approximate="tanh").numpy()
    assert np.allclose(ACTIVATIONS["GELU_TANH"](x), want, rtol=1e-6, atol=2e-7)


def test_a_checkpoint_of_another_family_or_without_minicpmv_fields_is_a_one_line_error(tmp_path: Path) -> None:
    from llmbuild import LlmbuildError
    from llmbuild.families.minicpmv.family import read_config
    from llmbuild.importer.vision_tower import export_family_onnx
    from llmbuild.recipe import load_recipe

    recipe = load_recipe(RECIPE, Path(__file__).resolve().parent.parent / "recipes", require_checkpoint=False)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "internvl"}))
    with pytest.raises(LlmbuildError, match="model_type 'internvl' is not a checkpoint of vision.family minicpmv"):
        export_family_onnx(recipe, tmp_path, tmp_path / "vit.onnx")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "minicpmv", "vision_config": {}}))
    with pytest.raises(LlmbuildError, match=r"config.json: missing field 'query_num'") as err:
        read_config(tmp_path)
    assert "\n" not in str(err.value)


def test_sliced_pixels_equal_transformers_processor_bit_for_bit(tmp_path: Path) -> None:
    """Every piece's pixels (overview and slices: resize, crop, /255, mean and deviation 0.5) against
    transformers' MiniCPM-V PIL processor (patch 7 with its "4x" merge rounds sides to 14 px, as 2.6 does),
    its patch layout undone."""
    from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil

    from llmbuild.families.minicpmv.runtime import load_sliced

    proc = MiniCPMV4_6ImageProcessorPil()
    for seed, size in enumerate([(70, 90), (40, 120), (20, 40), (300, 200)]):  # 4, 3, 1 and 8 slices
        path = picture(tmp_path / f"{seed}.png", seed, size)
        mine = load_sliced(path, 42, 14, 9)
        with Image.open(path) as image:
            out = proc(images=[image.convert("RGB")], patch_size=7, downsample_mode="4x", scale_resolution=42,
                       max_slice_nums=9)
        grid = out["grids"][0]
        assert mine.grid == (None if grid == [0, 0] else (grid[1], grid[0]))
        flat, start = np.asarray(out["pixel_values"])[0], 0
        assert len(out["target_sizes"]) == len(mine.pieces)
        for (h7, w7), piece in zip(np.asarray(out["target_sizes"]), mine.pieces, strict=True):
            theirs = flat[:, :, start : start + h7 * w7 * 7].reshape(3, 7, h7, w7, 7).transpose(0, 2, 1, 3, 4)
            start += h7 * w7 * 7
            assert np.array_equal(theirs.reshape(3, h7 * 7, w7 * 7), piece)


def test_a_literal_unk_is_text_and_generation_stops_where_the_published_chat_stops(built: Path) -> None:
    """The published processor places an image's features between its start and end tokens; the same
    `<unk>` elsewhere in a user's text is text. Its `chat()` stops at `<|im_end|>` and `<|endoftext|>`."""
    from llmbuild.binary.container import Container
    from llmbuild.families.minicpmv.family import CHAT_TERMINATORS
    from llmbuild.frontend.tokenizer_files import token_ids_by_string
    from llmbuild.runtime.compiled_model import image_runs
    from llmbuild.runtime.session import Session

    model = Session(built / RECIPE / f"{RECIPE}.llmb").model
    meta = model.vision.meta
    unk, start, slice_start = (int(meta[k]) for k in ("image_token_id", "image_start_id", "slice_start_id"))
    ids = [11, unk, 12, start, unk, unk, int(meta["image_end_id"]), slice_start, unk, 13, unk]
    assert image_runs(ids, meta) == [4, 8]
    with Container(built / RECIPE / f"{RECIPE}.llmb") as c:
        known = token_ids_by_string(bytes(c.section("tokenizer")).decode())
    stops = [known[t] for t in CHAT_TERMINATORS if t in known]
    assert stops and set(stops) <= set(model.meta["eos_token_ids"])

"""MiniCPM-V 4.6 (Qwen3.5 text model) against transformers' native `minicpmv4_6` classes: the tiny synthetic
checkpoint loads into MiniCPMV4_6ForConditionalGeneration with no missing or unexpected tensor, and the static
vit net's module (patches in merge order, padded, host-computed positions and masks) gives transformers' own
get_image_features rows for pieces of several patch grids; the built binary (Qwen3.5 text nets and the compiled
vit net) generates transformers' greedy ids for images of one and of several slices, given the native Pillow
image processor's pixels and the processor's placeholder layout, and the runtime's own slicing gives the
processor's pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

RECIPE = "minicpmv4_6_tiny_f32"
RECIPES = Path(__file__).resolve().parents[1] / "recipes"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped recipe built by the library steps the rules run, in this process."""
    from helpers import build_in_process

    return build_in_process(RECIPE, tmp_path_factory.mktemp("minicpmv4_6") / "build", RECIPES)


@pytest.fixture(scope="module")
def checkpoint(built: Path) -> Path:
    return built / "checkpoint"


def test_the_checkpoint_loads_into_transformers_native_class_with_every_tensor(checkpoint: Path) -> None:
    model, info = transformers.MiniCPMV4_6ForConditionalGeneration.from_pretrained(
        checkpoint / "vlm", dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert model.config.text_config.model_type == "qwen3_5_text"
    assert model.config.text_config.layer_types.count("linear_attention") == 3
    # the features fill the rows of <unk>, a token of the shared tokenizer
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(checkpoint / "vlm" / "tokenizer.json"))
    assert tokenizer.token_to_id("<unk>") == model.config.image_token_id


def test_the_checkpoint_is_reproducible_to_the_byte(checkpoint: Path, tmp_path: Path) -> None:
    from llmbuild.recipe import load_recipe
    from llmbuild.steps.prepare import prepare_checkpoint

    recipe = load_recipe(RECIPE, RECIPES)
    assert recipe.vision is not None and recipe.vision.config is not None
    prepare_checkpoint(recipe.source, tmp_path / "again", {**recipe.vision.config, "model_type": "minicpmv4_6"})
    for name in ("model.safetensors", "config.json", "preprocessor_config.json"):
        assert (tmp_path / "again" / "vlm" / name).read_bytes() == (checkpoint / "vlm" / name).read_bytes()


@pytest.mark.parametrize("grid", [(4, 4), (8, 8), (4, 12), (12, 8), (4, 64)])
def test_the_static_net_gives_transformers_rows_for_every_grid(checkpoint: Path, grid: tuple[int, int]) -> None:
    from llmbuild.families.minicpmv4_6.family import read_config, vit_geometry
    from llmbuild.families.minicpmv4_6.inputs import INPUTS, rows_of, slice_inputs
    from llmbuild.families.minicpmv4_6.model import load_vision, reference_features, static_vision

    vlm = checkpoint / "vlm"
    geo = vit_geometry(read_config(vlm))
    module, _ = static_vision(vlm)
    tower, merger, _ = load_vision(vlm)
    piece = np.random.default_rng(sum(grid)).standard_normal((3, grid[0] * 14, grid[1] * 14)).astype(np.float32)
    want = reference_features(tower, merger, piece)
    inputs = slice_inputs(piece, geo["patch"], geo["capacity"], geo["side"])
    with torch.no_grad():
        got = module(*[torch.from_numpy(inputs[k]) for k in INPUTS])[0].numpy()
    rows = rows_of(piece, geo["patch"])
    assert want.shape == (grid[0] * grid[1] // 16, 64) and rows == want.shape[0]
    np.testing.assert_allclose(got[:rows], want, rtol=0, atol=5e-6)
    assert np.abs(want).max() > 0.5  # the rows are not all near zero


def test_both_exporters_import_to_the_net_transformers_computes(checkpoint: Path, tmp_path: Path) -> None:
    """The real-size recipe exports with torch.export (the legacy exporter's trace runs the tower at the net's
    4096 patches, over a job's 4 GiB); the tiny one with the legacy exporter: the same net either way, with
    each product's weight the module's own tensor, not a transposed copy."""
    from llmbuild.dialects.interpret import interpret
    from llmbuild.families.minicpmv4_6.family import read_config, vit_geometry
    from llmbuild.families.minicpmv4_6.inputs import slice_inputs
    from llmbuild.families.minicpmv4_6.model import export_onnx, load_vision, reference_features
    from llmbuild.frontend.onnx_model import load_onnx
    from llmbuild.importer.onnx_net import import_onnx_net
    from llmbuild.verify.similarity import cosine

    vlm = checkpoint / "vlm"
    geo = vit_geometry(read_config(vlm))
    tower, merger, _ = load_vision(vlm)
    piece = np.random.default_rng(7).standard_normal((3, 8 * 14, 4 * 14)).astype(np.float32)
    want = reference_features(tower, merger, piece)
    inputs = slice_inputs(piece, geo["patch"], geo["capacity"], geo["side"])
    outs = {}
    for exporter in ("legacy", "dynamo"):
        graph = load_onnx(export_onnx(vlm, tmp_path / f"{exporter}.onnx", exporter))
        stored = list(graph.constants.values())
        net = import_onnx_net(graph, "vit")
        products = [w for name, w in net.weights.items() if name.endswith(".T")]
        shared = [any(np.shares_memory(w, c) for c in stored) for w in products]
        # legacy: Transpose(weight) nodes, taken as views; dynamo writes [K, N], which the import copies
        assert products and shared == [exporter == "legacy"] * len(products), exporter
        run = interpret(net.module, inputs, net.weights.__getitem__, reference=True)
        outs[exporter] = run.outputs["image_features"][0, : want.shape[0]]
        assert cosine(outs[exporter], want) >= 0.99999, exporter
    np.testing.assert_allclose(outs["legacy"], outs["dynamo"], rtol=0, atol=1e-5)


def test_a_large_checkpoint_exports_in_a_worker_process_the_same_graph(checkpoint: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Past IN_PROCESS_BYTES the export runs in a spawned worker (which returns torch's memory when it ends);
    below it in the step's own process: the same graph, byte for byte."""
    from llmbuild.importer import vision_tower
    from llmbuild.recipe import load_recipe

    recipe = load_recipe(RECIPE, RECIPES, require_checkpoint=False)
    contexts = []
    get_context = vision_tower.multiprocessing.get_context
    monkeypatch.setattr(vision_tower.multiprocessing, "get_context",
                        lambda kind: contexts.append(kind) or get_context(kind))
    here = vision_tower.export_family_onnx(recipe, checkpoint / "vlm", tmp_path / "here.onnx")
    assert contexts == []  # the tiny checkpoint exported in this process
    monkeypatch.setattr(vision_tower, "IN_PROCESS_BYTES", 0)
    worker = vision_tower.export_family_onnx(recipe, checkpoint / "vlm", tmp_path / "worker.onnx")
    assert contexts == ["spawn"] and worker.read_bytes() == here.read_bytes()


def _image(height: int, width: int, seed: int):
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    rgb = np.stack([x, y, 1 - x * y], axis=-1) * 200 + rng.integers(0, 56, (height, width, 3))
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB")


@pytest.fixture(scope="module")
def native(checkpoint: Path):
    from llmbuild.families.minicpmv4_6.verify import native_model

    return native_model(checkpoint / "vlm")


# (height, width) -> the processor's slice grid: one piece; an overview and 1x2 slices; an overview and 2x2.
IMAGES = {(100, 90): None, (112, 240): (1, 2), (230, 250): (2, 2)}


@pytest.mark.parametrize("size", list(IMAGES))
def test_greedy_ids_equal_transformers_native_model_given_its_processor_s_pixels(built: Path, native,
                                                                                  checkpoint: Path,
                                                                                  size: tuple[int, int]) -> None:
    from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil

    from llmbuild.families.minicpmv4_6.runtime import from_processor, placeholder_ids, slice_rgb
    from llmbuild.families.minicpmv4_6.verify import native_generate
    from llmbuild.runtime.compiled_model import CompiledModel

    model = CompiledModel(built / f"{RECIPE}.llmb")
    meta = model.vision.meta
    # the checkpoint's own processor (its preprocessor_config.json), not one set up from the binary's meta
    processor = MiniCPMV4_6ImageProcessorPil.from_pretrained(checkpoint / "vlm")
    assert (processor.scale_resolution, processor.max_slice_nums) == (meta["scale_resolution"], meta["max_slices"])
    image = _image(*size, seed=sum(size))
    out = processor(image, return_tensors="np")
    sliced = from_processor(out["pixel_values"], out["target_sizes"], out["grids"][0], meta["patch_size"])
    assert sliced.grid == IMAGES[size] and len(sliced) == 1 + (np.prod(IMAGES[size]) if IMAGES[size] else 0)
    # the runtime's own slicing (`llmbuild run --image`) gives the processor's pixels
    own = slice_rgb(image, meta["scale_resolution"], meta["patch_size"], meta["max_slices"])
    assert own.grid == sliced.grid and len(own) == len(sliced)
    for mine, theirs in zip(own.pieces, sliced.pieces, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-6)
    prompt = placeholder_ids(meta, sliced, 0, model.vision.encode) + [10, 20, 30, 40]
    unk = meta["image_token_id"]
    assert prompt.count(unk) == int(out["target_sizes"].prod(-1).sum()) // 16
    ids, logits = model.generate(prompt, 12, images=[sliced])
    want, want_logits = native_generate(native, prompt, list(sliced.pieces), 12)
    assert ids == want
    np.testing.assert_allclose(logits[0], want_logits, rtol=0, atol=1e-3)
    # the image decides what is generated: another image's pixels in the same placeholders give other logits
    other = [np.ascontiguousarray(p[:, ::-1, ::-1]) for p in sliced.pieces]
    _, other_logits = native_generate(native, prompt, other, 1)
    assert np.abs(other_logits - want_logits).max() > 0.05


def test_the_streamed_image_reference_equals_the_native_model(checkpoint: Path, native) -> None:
    """The end-to-end step's reference (stream.streamed_image_generate: the tower's encoder layers made as they
    run, the text model streamed over the weights the build reads) gives the native model's ids and logits on
    pieces of three grids in one prompt; without the pieces' rows it generates something else."""
    from llmbuild.families.minicpmv4_6.stream import streamed_image_generate, streamed_vision
    from llmbuild.families.minicpmv4_6.verify import native_generate
    from llmbuild.verify.stream_weights import HFWeights

    unk = native.config.image_token_id
    rng = np.random.default_rng(3)
    pieces = [rng.uniform(-1, 1, (3, 14 * h, 14 * w)).astype(np.float32) for h, w in ((4, 4), (8, 8), (4, 12))]
    prompt = [1, 5, *[unk] * 1, 9, *[unk] * 4, *[unk] * 3, 42, 3]
    tower, _ = streamed_vision(checkpoint / "vlm")  # no encoder layer held: each is made as it runs
    assert not [name for name, _ in tower.named_parameters() if "encoder.layers" in name]
    weights = HFWeights(checkpoint)
    ids, logits = streamed_image_generate(weights, checkpoint / "vlm", prompt, pieces, unk, 8)
    want, want_logits = native_generate(native, prompt, pieces, 8)
    assert ids == want and len(ids) == 8
    np.testing.assert_allclose(logits[0], want_logits, rtol=0, atol=1e-4)  # measured: 2.8e-5 at |logit| 11
    plain, _ = streamed_image_generate(weights, checkpoint / "vlm", [1, 5, 9, 42, 3], [], unk, 8)
    assert plain != ids
    with pytest.raises(Exception, match="image token rows"):
        streamed_image_generate(weights, checkpoint / "vlm", prompt, pieces[:2], unk, 1)


def test_the_checked_vision_shapes_are_transformers_own(checkpoint: Path) -> None:
    import json

    from llmbuild.families.minicpmv4_6.checkpoint import expected_vision_shapes
    from llmbuild.families.minicpmv4_6.synthetic import vision_shapes

    config = json.loads((checkpoint / "vlm" / "config.json").read_text())
    assert expected_vision_shapes(config) == vision_shapes(config)


def test_a_checkpoint_missing_a_vision_tensor_is_refused_in_one_line(checkpoint: Path, tmp_path: Path) -> None:
    import shutil

    from safetensors.numpy import load_file, save_file

    from llmbuild import LlmbuildError
    from llmbuild.families.minicpmv4_6.checkpoint import check_vision_tensors
    from llmbuild.frontend.hf import HFSource

    out = tmp_path / "vlm"
    shutil.copytree(checkpoint / "vlm", out)
    tensors = load_file(str(out / "model.safetensors"))
    del tensors["model.merger.mlp.0.linear_2.bias"]
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(LlmbuildError) as err:
        check_vision_tensors(out, HFSource(out).entries())
    assert "missing tensor 'model.merger.mlp.0.linear_2.bias'" in str(err.value) and "\n" not in str(err.value)


def test_the_slicing_scale_is_the_processor_s_not_config_json_s_image_size(checkpoint: Path, tmp_path: Path) -> None:
    """The published checkpoint's config.json says image_size 1120 and its preprocessor_config.json
    scale_resolution 448: its processor slices at 448, so the vit net and the runtime do too."""
    import json
    import shutil

    from llmbuild.families.minicpmv4_6.family import read_config, vit_geometry

    out = tmp_path / "vlm"
    shutil.copytree(checkpoint / "vlm", out)
    config = json.loads((out / "config.json").read_text()) | {"image_size": 1120}
    (out / "config.json").write_text(json.dumps(config))
    processor = json.loads((out / "preprocessor_config.json").read_text()) | {"scale_resolution": 448,
                                                                              "max_slice_nums": 4}
    (out / "preprocessor_config.json").write_text(json.dumps(processor))
    geo = vit_geometry(read_config(out))
    assert (geo["scale"], geo["max_slices"]) == (448, 4)
    (out / "preprocessor_config.json").unlink()  # an older checkpoint: transformers' processor defaults
    geo = vit_geometry(read_config(out))
    assert (geo["scale"], geo["max_slices"]) == (448, 9)
    (out / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(Exception, match="preprocessor_config.json: cannot read") as err:
        read_config(out)
    assert "\n" not in str(err.value)


def test_the_image_tokens_are_those_the_tokenizer_names_as_transformers_reads_them(checkpoint: Path,
                                                                                   tmp_path: Path) -> None:
    """transformers' processor writes `tokenizer.image_token`, `.slice_start_token`, ... (tokenizer_config.json's
    extra_special_tokens): a checkpoint naming other tokens gets their ids in the binary's meta, the ids
    transformers' tokenizer gives, and its processor's use_image_id; a named token the tokenizer lacks, or an image
    token whose id is not config.json's image_token_id, is a one-line error naming it."""
    import json
    import shutil

    from llmbuild import LlmbuildError
    from llmbuild.families.minicpmv4_6.family import read_config, runtime_meta

    out = tmp_path / "vlm"
    shutil.copytree(checkpoint / "vlm", out)
    added = {t["content"]: t["id"] for t in json.loads((out / "tokenizer.json").read_text())["added_tokens"]}
    before = runtime_meta(read_config(out), added, out / "tokenizer.json")
    assert before["image_token_id"] == added["<unk>"] and before["use_image_id"]

    def write(named: dict, image_token_id: int) -> None:
        tokenizer = json.loads((out / "tokenizer_config.json").read_text()) | {"extra_special_tokens": named}
        (out / "tokenizer_config.json").write_text(json.dumps(tokenizer))
        config = json.loads((out / "config.json").read_text()) | {"image_token_id": image_token_id}
        (out / "config.json").write_text(json.dumps(config))

    write({"image_token": "</image_id>", "image_id_end_token": "<unk>"}, added["</image_id>"])
    processor = json.loads((out / "preprocessor_config.json").read_text()) | {"use_image_id": False}
    (out / "preprocessor_config.json").write_text(json.dumps(processor))
    meta = runtime_meta(read_config(out), added, out / "tokenizer.json")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert meta["image_token_id"] == tok.image_token_id == added["</image_id>"]
    assert meta["image_id_end_id"] == tok.convert_tokens_to_ids(tok.image_id_end_token) == added["<unk>"]
    assert meta["slice_start_id"] == before["slice_start_id"] and not meta["use_image_id"]
    write({"image_token": "<|image_pad|>"}, added["</image_id>"])
    with pytest.raises(LlmbuildError, match="no '<\\|image_pad\\|>' token \\(the image_token") as err:
        runtime_meta(read_config(out), added, out / "tokenizer.json")
    assert "\n" not in str(err.value)
    write({"image_token": "</image_id>"}, added["<unk>"])
    with pytest.raises(LlmbuildError, match="image token '</image_id>' is id .*image_token_id is"):
        runtime_meta(read_config(out), added, out / "tokenizer.json")


def test_bad_pieces_and_configs_are_one_line_errors(checkpoint: Path, tmp_path: Path) -> None:
    import json
    import shutil

    from llmbuild import LlmbuildError
    from llmbuild.families.minicpmv4_6.family import read_config
    from llmbuild.families.minicpmv4_6.inputs import slice_inputs

    with pytest.raises(LlmbuildError, match="multiples of 56"):
        slice_inputs(np.zeros((3, 42, 56), np.float32), 14, 256, 4)
    with pytest.raises(LlmbuildError, match="more than the vit net's 16"):
        slice_inputs(np.zeros((3, 56, 112), np.float32), 14, 16, 4)
    out = tmp_path / "vlm"
    shutil.copytree(checkpoint / "vlm", out)
    config = json.loads((out / "config.json").read_text()) | {"downsample_mode": "4x"}
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(LlmbuildError, match="downsample_mode '4x'"):
        read_config(out)


def test_the_estimate_s_flops_are_torch_s_count_of_the_exported_module(checkpoint: Path) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    from llmbuild.families.minicpmv4_6.cost import estimate, vit_flops
    from llmbuild.families.minicpmv4_6.family import read_config, vit_geometry
    from llmbuild.families.minicpmv4_6.inputs import INPUTS, slice_inputs
    from llmbuild.families.minicpmv4_6.model import static_vision

    vlm = checkpoint / "vlm"
    cfg = read_config(vlm)
    geo, vc = vit_geometry(cfg), cfg["vision_config"]
    module, _ = static_vision(vlm)
    inputs = slice_inputs(np.zeros((3, 56, 56), np.float32), geo["patch"], geo["capacity"], geo["side"])
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(*[torch.from_numpy(inputs[k]) for k in INPUTS])
    flops, _ = vit_flops(vc["hidden_size"], vc["intermediate_size"], vc["num_hidden_layers"], geo["insert"],
                         geo["patch"], geo["capacity"], geo["embed_dim"])
    assert flops == counter.get_total_flops()
    est = estimate(cfg, "f32", "bm1684x")
    assert est["vision_encode_s"] > 0 and est["vision_pieces_per_image"] == 10


def test_the_generator_writes_minicpm_v_4_6_s_layout(tmp_path: Path) -> None:
    """benchmarks/make_checkpoint.py's MiniCPM-V 4.6 stand-in, at full size without writing it: every tensor of
    transformers' MiniCPMV4_6ForConditionalGeneration for the shipped config at its shape (the head tied), 1.30 B
    parameters as the model card says. A truncated variant (4 text layers and 2 tower layers at small widths)
    written out loads with no key missing, unexpected or mismatched, and its processor slices at 448."""
    import json

    from test_make_checkpoint import mc
    from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil

    from llmbuild.families.minicpmv4_6.family import read_config, vit_geometry
    from llmbuild.families.minicpmv4_6.synthetic import native_model

    layout = mc.layout_for(mc.ALL_MODELS["minicpm_v_4_6"])
    reference = native_model(layout.config, "meta")
    want = {name: tuple(t.shape) for name, t in reference.state_dict().items() if name != "lm_head.weight"}
    plans = mc.minicpmv4_6_tensor_plans(layout)
    assert {p.name: p.shape for p in plans} == want
    assert sum(np.prod(p.shape) for p in plans) / 1e9 == pytest.approx(1.30, abs=0.005)
    tokenizer = mc.build_tokenizer(layout)
    assert tokenizer.token_to_id("<unk>") == layout.config["image_token_id"] == 248070

    shipped = json.loads((mc.CONFIGS / "minicpm_v_4_6.json").read_text())["text_config"]
    small = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1,
             "head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
             "linear_value_head_dim": 32, "layer_types": shipped["layer_types"][:4]}
    tower = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
    directory, written = mc.make_checkpoint("minicpm_v_4_6", tmp_path, layers=4, vocab_size=1024, overrides=small,
                                            vision_overrides=tower)
    assert written and directory.name == "MiniCPM-V-4.6"
    loaded, info = transformers.MiniCPMV4_6ForConditionalGeneration.from_pretrained(
        directory, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    processor = MiniCPMV4_6ImageProcessorPil.from_pretrained(directory)
    geo = vit_geometry(read_config(directory))
    assert (processor.scale_resolution, processor.max_slice_nums) == (geo["scale"], geo["max_slices"]) == (448, 9)


def test_the_vision_loader_fills_the_module_in_place_and_names_a_missing_or_misshapen_tensor(tmp_path: Path) -> None:
    """siglip.load_prefixed copies each stored tensor into the module's own parameter (the module is not held
    twice): the values are the file's, in float32; a tensor the module has no place for is not read; a missing
    or misshapen one is one line naming it."""
    from safetensors.torch import save_file

    from llmbuild import LlmbuildError
    from llmbuild.families.siglip import load_prefixed

    module = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2))
    before = module[0].weight
    stored = {"vpm.0.weight": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "vpm.0.bias": torch.ones(2),
              "vpm.1.weight": torch.full((2,), 2.0), "vpm.1.bias": torch.zeros(2), "vpm.9.extra": torch.ones(1),
              "llm.other": torch.ones(4)}
    save_file(stored, str(tmp_path / "model.safetensors"))
    load_prefixed(tmp_path, {"vpm.": module})
    assert module[0].weight is before and module[0].weight.dtype == torch.float32
    assert module[0].weight.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and module[1].weight.tolist() == [2.0, 2.0]
    save_file({k: v for k, v in stored.items() if k != "vpm.1.bias"}, str(tmp_path / "model.safetensors"))
    with pytest.raises(LlmbuildError, match="missing vision tensor vpm.1.bias") as err:
        load_prefixed(tmp_path, {"vpm.": module})
    assert "\n" not in str(err.value)
    save_file({**stored, "vpm.0.bias": torch.ones(3)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(LlmbuildError, match=r"tensor 'vpm.0.bias' has shape \[3\], expected \[2\]"):
        load_prefixed(tmp_path, {"vpm.": module})

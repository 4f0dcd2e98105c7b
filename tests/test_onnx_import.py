"""The ONNX frontend: a vision tower exported by torch.onnx imports to TopOp that computes what
transformers computes, from either exporter, with the attention, GELU and patch-embedding patterns fused."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from llmbuild import LlmbuildError  # noqa: E402
from llmbuild.dialects.interpret import interpret  # noqa: E402
from llmbuild.families.internvl.model import export_onnx, vision_module  # noqa: E402
from llmbuild.frontend.onnx_model import load_onnx  # noqa: E402
from llmbuild.importer.onnx_net import MASK_INPUT, import_onnx_net  # noqa: E402
from llmbuild.verify.similarity import cosine  # noqa: E402

IMAGE = 56  # 4x4 patches of 14: 16 tokens and the class token, 4 image tokens after the pixel shuffle


@pytest.fixture(scope="module")
def internvl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny InternVL in transformers' native layout, every parameter random (norms and layer scales too,
    so a swapped gamma/beta or a dropped layer scale would show)."""
    config = transformers.InternVLConfig(
        vision_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "image_size": [IMAGE, IMAGE], "patch_size": [14, 14],
                       "layer_scale_init_value": 0.1, "norm_type": "layer_norm"},
        text_config={"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
                     "max_position_embeddings": 256},
        image_token_id=299, downsample_ratio=0.5)
    torch.manual_seed(0)
    model = transformers.InternVLForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("layernorm_before.weight", "layernorm_after.weight", "layer_norm.weight")):
                p.copy_(1 + 0.2 * torch.rand_like(p))
            elif "lambda_" in name:
                p.copy_(0.5 + torch.rand_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    out = tmp_path_factory.mktemp("internvl")
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def pixels() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((1, 3, IMAGE, IMAGE)).astype(np.float32)


@pytest.fixture(scope="module")
def transformers_features(internvl_dir: Path, pixels: np.ndarray) -> np.ndarray:
    """transformers' own InternVLForConditionalGeneration computes the features the vit net must give."""
    model = transformers.InternVLForConditionalGeneration.from_pretrained(internvl_dir).eval()
    with torch.no_grad():
        out = model.model.get_image_features(pixel_values=torch.from_numpy(pixels), return_dict=True)
    return out.pooler_output.numpy()


def run_imported(path: Path, pixels: np.ndarray):
    net = import_onnx_net(load_onnx(path), "vit")
    inputs = {"pixel_values": pixels}
    if MASK_INPUT in net.input_names:
        tokens = net.module.body.block.ops.first.body.block.args[1].type.get_shape()[-1]
        inputs[MASK_INPUT] = np.zeros((1, 1, tokens, tokens), np.float32)
    return net, interpret(net.module, inputs, net.weights.__getitem__, reference=True).outputs["image_features"]


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_imported_tower_computes_what_transformers_computes(internvl_dir: Path, pixels: np.ndarray,
                                                            transformers_features: np.ndarray, exporter: str,
                                                            tmp_path: Path) -> None:
    path = export_onnx(internvl_dir, tmp_path / f"vit_{exporter}.onnx", exporter)
    net, features = run_imported(path, pixels)
    assert features.shape == transformers_features.shape == (1, 4, 64)
    assert cosine(features, transformers_features) >= 0.99999
    ops = collections.Counter(op.name for op in net.module.body.block.ops.first.body.block.ops)
    # Two layers: two fused attentions, GELU in both MLPs and the projector; no Erf, Softmax or Div left.
    assert ops["top.FAttention"] == 2 and ops["top.GELU"] == 3 and ops["top.LayerNorm"] == 5
    assert ops["top.Softmax"] == 0 and ops["top.Slice"] == 1


def test_both_exporters_import_to_graphs_with_the_same_outputs(internvl_dir: Path, pixels: np.ndarray,
                                                               tmp_path: Path) -> None:
    legacy = run_imported(export_onnx(internvl_dir, tmp_path / "a.onnx", "legacy"), pixels)
    dynamo = run_imported(export_onnx(internvl_dir, tmp_path / "b.onnx", "dynamo"), pixels)
    assert (tmp_path / "b.onnx.data").is_file()  # the dynamo exporter's external weights were read
    np.testing.assert_allclose(legacy[1], dynamo[1], rtol=0, atol=1e-12)
    assert [op.name for op in legacy[0].module.body.block.ops.first.body.block.ops] == \
        [op.name for op in dynamo[0].module.body.block.ops.first.body.block.ops]


def test_the_exported_module_is_transformers_own(internvl_dir: Path, pixels: np.ndarray,
                                                 transformers_features: np.ndarray) -> None:
    module, _ = vision_module(internvl_dir)
    with torch.no_grad():
        got = module(torch.from_numpy(pixels)).numpy()
    # The same code and weights; the loaded model runs its default SDPA attention, the export eager attention.
    np.testing.assert_allclose(got, transformers_features, rtol=0, atol=1e-5)
    assert cosine(got, transformers_features) >= 0.9999999


def test_unsupported_onnx_gives_one_line(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Sin", ["x"], ["y"], name="sine")], "g", [x], [y])
    path = tmp_path / "sin.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(LlmbuildError, match=r"sin\.onnx: node sine \(Sin\): operator not supported") as err:
        import_onnx_net(load_onnx(path), "vit")
    assert "\n" not in str(err.value)
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    with pytest.raises(LlmbuildError, match="bad.onnx: not a valid ONNX model"):
        load_onnx(tmp_path / "bad.onnx")


def test_dynamic_shapes_are_refused_with_the_value_named(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    path = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(LlmbuildError, match=r"value 'x' has a dynamic shape \['batch', 4\]"):
        load_onnx(path)


@pytest.mark.parametrize("one_file", [True, False])
def test_the_exporters_external_weight_files_are_removed_and_the_graph_kept(tmp_path: Path, one_file: bool) -> None:
    """The dynamo exporter writes one `.data` file beside the graph, the legacy exporter one file per tensor past
    protobuf's 2 GB: once imported, every file the graph names goes, and nothing else."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from llmbuild.importer.vision_tower import remove_external_data

    weights = [numpy_helper.from_array(np.full((64, 64), i, np.float32), f"w{i}") for i in range(3)]
    node = helper.make_node("MatMul", ["x", "w0"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], weights)
    path = tmp_path / "vit.onnx"
    onnx.save_model(helper.make_model(graph), str(path), save_as_external_data=True,
                    all_tensors_to_one_file=one_file, location="vit.onnx.data" if one_file else None, size_threshold=0)
    outside = tmp_path / "kept.bin"
    outside.write_bytes(b"x")
    written = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("vit.onnx", "kept.bin"))
    assert written == (["vit.onnx.data"] if one_file else ["w0", "w1", "w2"])
    remove_external_data(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.bin", "vit.onnx"]
    assert len(onnx.load(str(path), load_external_data=False).graph.initializer) == 3

"""InternVL's original `internvl_chat` layout (what the published OpenGVLab checkpoints and TPU-MLIR use) read
as the native one: the tiny synthetic InternVL converted here, with the inverse of transformers' conversion
table written out independently of llmbuild/families/internvl/model.py, gives the same tensors, the same
image features and, built, the same greedy ids as the native directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import build_tiny_internvl_dir, snakemake

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnx")

F32 = "internvl_tiny_f32"

# native -> internvl_chat, the inverse of convert_internvl_weights_to_hf.py's tables (applied in this order).
INVERSE = (
    ("model.vision_tower.", "vision_model."),
    (".encoder.layer.", ".encoder.layers."),
    (".embeddings.cls_token", ".embeddings.class_embedding"),
    (".embeddings.position_embeddings", ".embeddings.position_embedding"),
    (".patch_embeddings.projection.", ".patch_embedding."),
    (".lambda_1", ".ls1"),
    (".lambda_2", ".ls2"),
    (".attention.projection_layer.", ".attn.proj."),
    (".layernorm_before.", ".norm1."),
    (".layernorm_after.", ".norm2."),
    ("model.multi_modal_projector.layer_norm.", "mlp1.0."),
    ("model.multi_modal_projector.linear_1.", "mlp1.1."),
    ("model.multi_modal_projector.linear_2.", "mlp1.3."),
    ("model.language_model.", "language_model.model."),
    ("lm_head.", "language_model.lm_head."),
)


def chat_name(native: str) -> str:
    for old, new in INVERSE:
        native = native.replace(old, new)
    return native


def to_internvl_chat(native: Path, out: Path) -> Path:
    """The native directory `native` written in the internvl_chat layout under `out` (qkv fused)."""
    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True)
    tensors = load_file(str(native / "model.safetensors"))
    chat: dict[str, np.ndarray] = {}
    for key, value in tensors.items():
        if ".attention.k_proj." in key or ".attention.v_proj." in key:
            continue
        if ".attention.q_proj." in key:
            parts = [tensors[key.replace(".q_proj.", f".{p}.")] for p in ("q_proj", "k_proj", "v_proj")]
            chat[chat_name(key.replace(".attention.q_proj.", ".attn.qkv."))] = np.concatenate(parts)
            continue
        chat[chat_name(key)] = value
    if "lm_head.weight" not in tensors:  # published chat checkpoints store the tied head too
        chat["language_model.lm_head.weight"] = tensors["model.language_model.embed_tokens.weight"]
    save_file(chat, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((native / "config.json").read_text())
    vision = cfg["vision_config"]
    chat_cfg = {
        "architectures": ["InternVLChatModel"], "model_type": "internvl_chat", "template": "internvl2_5",
        "downsample_ratio": cfg["downsample_ratio"], "ps_version": "v2", "select_layer": -1,
        "force_image_size": vision["image_size"][0], "dynamic_image_size": True, "use_thumbnail": True,
        "max_dynamic_patch": 12, "min_dynamic_patch": 1, "torch_dtype": cfg["torch_dtype"],
        "llm_config": {**cfg["text_config"], "_name_or_path": "./pretrained/Qwen2.5", "use_bfloat16": False},
        "vision_config": {
            "architectures": ["InternVisionModel"], "model_type": "intern_vit_6b", "hidden_size": vision["hidden_size"],
            "intermediate_size": vision["intermediate_size"], "num_hidden_layers": vision["num_hidden_layers"],
            "num_attention_heads": vision["num_attention_heads"], "image_size": vision["image_size"][0],
            "patch_size": vision["patch_size"][0], "num_channels": 3, "qkv_bias": False, "qk_normalization": False,
            "norm_type": "layer_norm", "layer_norm_eps": 1e-6, "hidden_act": "gelu", "drop_path_rate": 0.0,
            "use_flash_attn": False, "initializer_factor": 0.1,
        },
    }
    (out / "config.json").write_text(json.dumps(chat_cfg, indent=1))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(native / name, out / name)
    return out


@pytest.fixture(scope="module")
def native(build_root: Path) -> Path:
    snakemake(build_root, F32)
    return build_root / F32 / "checkpoint" / "vlm"


@pytest.fixture(scope="module")
def chat(native: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return to_internvl_chat(native, tmp_path_factory.mktemp("chat") / "InternVL-tiny-chat")


def test_the_view_gives_every_native_tensor_bit_for_bit(native: Path, chat: Path) -> None:
    from safetensors.numpy import load_file

    from llmbuild.families.internvl.model import TensorView

    want = load_file(str(native / "model.safetensors"))
    view = TensorView(chat)
    assert view.chat and set(want) <= set(view.parts)
    for name, value in want.items():
        assert np.array_equal(view.get(name).numpy(), value), name


def test_the_config_is_transformers_native_one(native: Path, chat: Path) -> None:
    from llmbuild.families.internvl.model import load_config
    from llmbuild.frontend.hf import text_config

    ours, theirs = load_config(chat), transformers.InternVLConfig.from_pretrained(native)
    assert ours.image_token_id == theirs.image_token_id and ours.downsample_ratio == theirs.downsample_ratio
    assert ours.image_seq_length == 4  # (56 / 14 * 0.5) ** 2
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "image_size",
                  "patch_size", "norm_type", "layer_norm_eps", "attention_bias", "use_qk_norm", "hidden_act"):
        assert getattr(ours.vision_config, field) == getattr(theirs.vision_config, field), field
    chat_text = text_config(json.loads((chat / "config.json").read_text()))
    assert chat_text == text_config(json.loads((native / "config.json").read_text()))  # remote-code keys dropped


def test_the_vision_module_computes_the_same_features(native: Path, chat: Path) -> None:
    from llmbuild.families.internvl.model import vision_module

    pixels = torch.from_numpy(np.random.default_rng(3).standard_normal((2, 3, 56, 56)).astype(np.float32))
    with torch.no_grad():
        a = vision_module(native)[0](pixels)
        b = vision_module(chat)[0](pixels)
        whole = transformers.InternVLForConditionalGeneration.from_pretrained(
            native, attn_implementation="eager").eval()  # the exported module's attention: same bits
        c = whole.model.get_image_features(pixel_values=pixels, return_dict=True).pooler_output
    assert torch.equal(a, b) and torch.equal(a, c)


def test_bad_chat_configs_give_one_line_errors(chat: Path, tmp_path: Path) -> None:
    from llmbuild import LlmbuildError
    from llmbuild.families.internvl.config import native_config

    cfg = json.loads((chat / "config.json").read_text())
    with pytest.raises(LlmbuildError, match=r"^x/config.json: ps_version: 'v1' is not supported"):
        native_config(cfg | {"ps_version": "v1"}, "x/config.json")
    vision = {k: v for k, v in cfg["vision_config"].items() if k != "patch_size"}
    with pytest.raises(LlmbuildError, match=r"^x/config.json: vision_config.patch_size: missing$"):
        native_config(cfg | {"vision_config": vision}, "x/config.json")
    with pytest.raises(LlmbuildError, match=r"^x/config.json: llm_config: expected"):
        native_config({k: v for k, v in cfg.items() if k != "llm_config"} | {"model_type": "internvl_chat"},
                      "x/config.json")


def test_an_internvl_chat_directory_builds_to_the_native_ids(native: Path, chat: Path, build_root: Path,
                                                               tmp_path: Path) -> None:
    build = build_tiny_internvl_dir(tmp_path, chat, "internvl_chat")
    report = json.loads((build / "internvl_chat" / "verify.json").read_text())
    assert report["passed"] and report["end_to_end"]["tokens_equal"] and report["end_to_end_image"]["tokens_equal"]
    ours = json.loads((build / "internvl_chat" / "e2e.json").read_text())
    theirs = json.loads((build_root / F32 / "e2e.json").read_text())
    assert ours["image"]["ids"] == theirs["image"]["ids"] and ours["ids"] == theirs["ids"]
    assert ours["image"]["prompt_ids"] == theirs["image"]["prompt_ids"]
    vision = json.loads((build / "internvl_chat" / "vision" / "metrics.json").read_text())
    assert vision["cosine_device"] >= 0.9999
    # `llmbuild compile DIR` sees the tower in this layout too
    from llmbuild.steps.oneshot import CompileRequest, recipe_for

    _, text = recipe_for(CompileRequest(chat, tmp_path / "out", "f32", "bm1684x", 64, 16))
    assert 'vision: {"family": "internvl"}' in text and 'architecture: "qwen2"' in text

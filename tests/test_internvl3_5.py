"""InternVL3.5: InternViT with a Qwen3 language model (q and k RMSNorm per head, an explicit head_dim). The
tiny recipe built as a user builds it, its checkpoint loaded by transformers' native InternVL class, and the
binary's greedy ids, for an image of one tile and one of several, against transformers'
InternVLForConditionalGeneration given the pixels of transformers' own image processor (GotOcr2's, which
InternVLProcessor uses) and the prompt laid out as InternVLProcessor lays it out (written here by hand:
InternVLProcessor needs torchvision, which does not load)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import snakemake

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnx")
Image = pytest.importorskip("PIL.Image")

F32 = "internvl3_5_tiny_f32"
TEXT = [1, 5, 9, 42]
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]  # InternVL's (ImageNet's)
MAX_TILES = 4  # the recipe's vision.max_tiles


@pytest.fixture(scope="module")
def built(build_root: Path) -> Path:
    snakemake(build_root, F32)
    return build_root / F32


@pytest.fixture(scope="module")
def reference(built: Path) -> object:
    model, info = transformers.InternVLForConditionalGeneration.from_pretrained(
        built / "checkpoint" / "vlm", local_files_only=True, output_loading_info=True)
    return model.eval(), info


def test_the_checkpoint_is_transformers_internvl_with_qwen3(built: Path, reference: object) -> None:
    model, info = reference
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    text = model.config.text_config
    assert text.model_type == "qwen3" and text.head_dim * text.num_attention_heads != text.hidden_size
    attention = model.model.language_model.layers[0].self_attn
    assert attention.q_norm.weight.shape == attention.k_norm.weight.shape == (text.head_dim,)
    report = json.loads((built / "verify.json").read_text())
    assert report["passed"] and report["end_to_end"]["tokens_equal"] and report["end_to_end_image"]["tokens_equal"]


# (width, height): a square image is one tile; 70 x 90 a 2 x 2 grid and the thumbnail
@pytest.mark.parametrize(("size", "tiles"), [((56, 56), 1), ((70, 90), 5)])
def test_greedy_ids_equal_transformers_on_its_image_processors_pixels(built: Path, reference: object, tmp_path: Path,
                                                                    size: tuple[int, int], tiles: int) -> None:
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    from llmbuild.runtime.session import Session

    model, _ = reference
    path = tmp_path / "image.png"
    rng = np.random.default_rng(tiles)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB").save(path)
    processor = GotOcr2ImageProcessorPil(size={"height": 56, "width": 56}, image_mean=MEAN, image_std=STD,
                                         crop_to_patches=True, min_patches=1, max_patches=MAX_TILES)
    pixels = processor(Image.open(path), return_tensors="np")["pixel_values"]
    assert pixels.shape == (tiles, 3, 56, 56)
    # InternVLProcessor's layout: <img>, image_seq_length <IMG_CONTEXT> per tile, </img>, then the text.
    tokenizer = transformers.AutoTokenizer.from_pretrained(built / "checkpoint" / "vlm")
    start, end, context = tokenizer.convert_tokens_to_ids(["<img>", "</img>", "<IMG_CONTEXT>"])
    assert context == model.config.image_token_id
    per_tile = int((56 // 14 * model.config.downsample_ratio) ** 2)
    prompt = [start] + [context] * (per_tile * tiles) + [end] + TEXT

    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=12, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt]), pixel_values=torch.from_numpy(pixels),
                             generation_config=config)
    want = [int(i) for i in out[0, len(prompt):]]
    without = model.generate(input_ids=torch.tensor([TEXT]), generation_config=config)[0, len(TEXT):].tolist()
    assert want != without  # the image's rows reach the reply

    session = Session(built / f"{F32}.llmb", ignore_eos=True, max_new_tokens=12)
    assert session.image_ids(path) + TEXT == prompt
    np.testing.assert_array_equal(session.image_pixels([path])[0], pixels)
    assert session.generate(prompt, images=[path]) == want

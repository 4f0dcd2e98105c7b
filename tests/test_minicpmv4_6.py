"""MiniCPM-V 4.6 (Qwen3.5 text model) against transformers' native `minicpmv4_6` classes: the tiny synthetic
checkpoint loads into MiniCPMV4_6ForConditionalGeneration with no missing or unexpected tensor, and the static
vit net's module (patches in merge order, padded, host-computed positions and masks) gives transformers' own
get_image_features rows for pieces of several patch grids."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

RECIPE = "minicpmv4_6_tiny_f32"
RECIPES = Path(__file__).resolve().parents[1] / "recipes"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The recipe's synthetic checkpoint, as prepare writes it (text model, and the whole model under vlm/)."""
    from llmbuild.families import registry
    from llmbuild.recipe import load_recipe
    from llmbuild.steps.prepare import prepare_checkpoint

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(registry.VISION_FAMILIES, "minicpmv4_6", "llmbuild.families.minicpmv4_6")
        recipe = load_recipe(RECIPE, RECIPES)
        assert recipe.vision is not None and recipe.vision.config is not None
        out = tmp_path_factory.mktemp("minicpmv4_6") / "checkpoint"
        prepare_checkpoint(recipe.source, out, {**recipe.vision.config, "model_type": "minicpmv4_6"})
        yield out


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
    from llmbuild.families import registry
    from llmbuild.recipe import load_recipe
    from llmbuild.steps.prepare import prepare_checkpoint

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(registry.VISION_FAMILIES, "minicpmv4_6", "llmbuild.families.minicpmv4_6")
        recipe = load_recipe(RECIPE, RECIPES)
        assert recipe.vision is not None and recipe.vision.config is not None
        prepare_checkpoint(recipe.source, tmp_path / "again", {**recipe.vision.config, "model_type": "minicpmv4_6"})
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "again" / "vlm" / name).read_bytes() == (checkpoint / "vlm" / name).read_bytes()


@pytest.mark.parametrize("grid", [(4, 4), (8, 8), (4, 12), (12, 8), (4, 64)])
def test_the_static_net_gives_transformers_rows_for_every_grid(checkpoint: Path, grid: tuple[int, int]) -> None:
    from llmbuild.families.minicpmv4_6.family import read_config
    from llmbuild.families.minicpmv4_6.inputs import INPUTS, rows_of, slice_inputs
    from llmbuild.families.minicpmv4_6.model import load_vision, reference_features, static_vision, vit_geometry

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

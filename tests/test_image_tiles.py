"""Images prepared as InternVL prepares them: llmbuild's Pillow + numpy tiling gives exactly the pixels of
transformers' own GotOcr2 image processor (the one InternVL's processor uses), for any aspect ratio."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmbuild import LlmbuildError
from llmbuild.families.internvl.runtime import load_pixels, tile_grid

Image = pytest.importorskip("PIL.Image")
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]  # InternVL's (ImageNet's)


@pytest.mark.parametrize(("height", "width", "max_tiles"), [
    (56, 112, 4), (100, 60, 4), (56, 56, 4), (200, 210, 6), (30, 170, 4), (448, 1000, 12), (90, 70, 1)])
def test_tiles_equal_transformers_image_processor(tmp_path: Path, height: int, width: int, max_tiles: int) -> None:
    pil = pytest.importorskip("transformers.models.got_ocr2.image_processing_pil_got_ocr2")
    path = tmp_path / "image.png"
    pixels = np.random.default_rng(height * width).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    processor = pil.GotOcr2ImageProcessorPil(size={"height": 56, "width": 56}, image_mean=MEAN, image_std=STD,
                                             crop_to_patches=max_tiles > 1, min_patches=1, max_patches=max_tiles)
    want = processor(Image.open(path), return_tensors="np")["pixel_values"]
    got = load_pixels(path, 56, MEAN, STD, max_tiles)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_grid_follows_the_aspect_ratio() -> None:
    assert tile_grid(448, 896, 448, 1, 12) == (2, 1)
    assert tile_grid(896, 448, 448, 1, 12) == (1, 2)
    assert tile_grid(448, 448, 448, 1, 12) == (1, 1)  # a square that fills one tile stays one
    assert tile_grid(1344, 1344, 448, 1, 12) == (3, 3)  # on a tie, the larger grid while the image fills it


def test_bad_images_give_one_line(tmp_path: Path) -> None:
    with pytest.raises(LlmbuildError, match="missing.png: image file not found"):
        load_pixels(tmp_path / "missing.png", 56, MEAN, STD)
    (tmp_path / "text.png").write_text("not an image")
    with pytest.raises(LlmbuildError, match="text.png: not an image Pillow can read"):
        load_pixels(tmp_path / "text.png", 56, MEAN, STD)

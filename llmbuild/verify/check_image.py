"""The fixed image the end-to-end checks of a vision-language build feed (InternVL and MiniCPM-V alike)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

IMAGE_SEED = 20261202


def test_image(path: Path, size: int) -> Path:
    """A fixed pseudo-random RGB image twice as wide as the tower's tiles (smooth colour gradients and
    noise: with vision.max_tiles >= 2 it is cut into two tiles and a thumbnail), written as PNG so that the
    check reads it the way `llmbuild run --image` reads a user's file."""
    from PIL import Image

    rng = np.random.default_rng(IMAGE_SEED)
    y, x = np.mgrid[0:size, 0 : 2 * size] / max(2 * size - 1, 1)
    rgb = np.stack([x, y, 1 - x * y], axis=-1) * 200 + rng.integers(0, 56, (size, 2 * size, 3))
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB").save(path)
    return path

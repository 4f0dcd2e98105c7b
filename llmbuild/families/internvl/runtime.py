"""InternVL's dynamic tiling and its image placeholders, on Pillow and numpy.

An image becomes pixels as InternVL's processor makes them (`load_pixels`): RGB; with meta.vision.max_tiles > 1,
resized (bicubic) to the grid of tiles closest to its aspect ratio (`tile_grid`) and cut into tiles of the
tower's size, plus a thumbnail of the whole when there are several; else resized to one tile. Each tile is
/255 and normalized by ImageNet's mean and deviation. The vit net is compiled for one tile: it runs once per
tile and gives `tokens_per_image` rows of the language model's width per tile. The prompt stands for an
image as `<img>`, that many `<IMG_CONTEXT>` ids per tile, `</img>` (`tile_ids`); the runtime copies the
rows into the embeddings of those ids before the prefill runs.

The runtime's VisionNet (runtime/vision.py) finds this module through the family registry and calls its
hooks `prepare`, `pixels`, `run_rows` and `image_ids` with itself as `net`; `llmbuild run --bmodel`
(runtime/bmodel_run.py) asks `vendor_feeds` for the bmodel's vit net's inputs. Nothing of the compiler here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.runtime.image_file import open_rgb

# The vit net's attention mask input, where its import made one: zeros (InternViT attends to every patch).
MASK_INPUT = "attention_mask"


def prepare(net: Any, image: Any) -> np.ndarray:
    """An image file tiled (`pixels`), or tiles already made: [tiles, 3, size, size] float32."""
    if not isinstance(image, str | Path | np.ndarray):
        raise LlmbuildError("an InternVL binary takes image files or tiles [tiles, 3, size, size], not a "
                            f"{type(image).__name__}")
    if isinstance(image, np.ndarray):
        size = int(net.meta["image_size"])
        return np.asarray(image, np.float32).reshape(-1, 3, size, size)
    return pixels(net.meta, image)


def pixels(meta: dict[str, Any], path: str | Path) -> np.ndarray:
    """An image file as the binary's meta.vision says to tile it."""
    return load_pixels(path, int(meta["image_size"]), meta["mean"], meta["std"], int(meta.get("max_tiles", 1)))


def run_rows(net: Any, tiles: np.ndarray) -> list[np.ndarray]:
    """One run of rows for the whole image: [tiles * tokens_per_image, hidden], the tiles in order."""
    return [features(net, tiles)]


def image_ids(net: Any, image: Any, index: int) -> list[int]:
    """The ids standing for one image (its tiles, or their count) in a prompt; `index` does not change them."""
    return tile_ids(net, image if isinstance(image, int) else len(image))


def features(net: Any, tiles: np.ndarray) -> np.ndarray:
    """[tiles * tokens_per_image, hidden] float32 for one image's tiles [tiles, 3, size, size]: the net once
    per tile, with a zero mask where it has one."""
    shapes, size = net.input_shapes(), int(net.meta["image_size"])
    rows = []
    for tile in np.asarray(tiles, np.float32).reshape(-1, 3, size, size):
        inputs = {"pixel_values": tile[None]}
        if MASK_INPUT in shapes:
            inputs[MASK_INPUT] = np.zeros(shapes[MASK_INPUT], np.float32)
        rows.append(net.run_net(inputs))
    return np.concatenate(rows)


def vendor_feeds(meta: dict[str, Any], tiles: np.ndarray, where: str) -> list[list[np.ndarray]]:
    """The bmodel's vit net's inputs for each tile [3, size, size] (`llmbuild run --bmodel`): the tile alone,
    [1, 3, size, size]; the net is compiled for one tile, as LLM-TPU's InternVL demos run it."""
    return [[tile[None]] for tile in np.asarray(tiles, np.float32)]


def tile_ids(net: Any, tiles: int = 1) -> list[int]:
    """The ids one image of `tiles` tiles takes in a prompt: <img>, tokens_per_image <IMG_CONTEXT> per tile,
    </img>."""
    m = net.meta
    return [int(m["image_start_id"]), *[int(m["image_token_id"])] * (net.tokens * tiles), int(m["image_end_id"])]


def tile_grid(height: int, width: int, size: int, min_tiles: int, max_tiles: int) -> tuple[int, int]:
    """(columns, rows) of InternVL's dynamic tiling: among the grids of min..max tiles (by tile count), the
    one whose aspect ratio is closest to the image's; on a tie the larger grid, while the image covers more
    than half of its area (transformers' GotOcr2 image processor, which InternVL uses, decides the same)."""
    grids = sorted(((c, r) for c in range(1, max_tiles + 1) for r in range(1, max_tiles + 1)
                    if min_tiles <= c * r <= max_tiles), key=lambda g: g[0] * g[1])
    aspect, area = width / height, width * height
    best, best_diff = (1, 1), float("inf")
    for c, r in grids:
        diff = abs(aspect - c / r)
        if diff < best_diff:
            best, best_diff = (c, r), diff
        elif diff == best_diff and area > 0.5 * size * size * c * r:
            best = (c, r)
    return best


def load_pixels(path: str | Path, size: int, mean: list[float], std: list[float], max_tiles: int = 1,
                use_thumbnail: bool = True) -> np.ndarray:
    """An image file as InternVL's processor makes it: RGB; with `max_tiles` > 1, resized (bicubic) to the
    grid of `tile_grid` and cut into size x size tiles row by row, plus the whole image resized as a
    thumbnail when there is more than one tile; else resized to one tile. Each tile /255 and normalized by
    the mean and deviation per channel: [tiles, 3, size, size] float32."""
    rgb = open_rgb(path)  # first: it says in one line when Pillow is missing
    from PIL import Image
    tiles = []
    if max_tiles > 1:
        columns, rows = tile_grid(rgb.height, rgb.width, size, 1, max_tiles)
        canvas = rgb.resize((size * columns, size * rows), Image.Resampling.BICUBIC)
        tiles = [canvas.crop((c * size, r * size, (c + 1) * size, (r + 1) * size))
                 for r in range(rows) for c in range(columns)]
    # No tiling: the image resized to one tile. One tile of a grid: that tile. Several: and the thumbnail.
    if not tiles or (len(tiles) > 1 and use_thumbnail):
        tiles.append(rgb.resize((size, size), Image.Resampling.BICUBIC))
    scaled = np.stack([np.asarray(t, dtype=np.float32) for t in tiles]) / 255.0
    normed = (scaled - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(normed.transpose(0, 3, 1, 2), dtype=np.float32)

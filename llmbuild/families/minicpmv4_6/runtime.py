"""MiniCPM-V 4.6's image slicing and the vit net's per-piece inputs, on Pillow and numpy.

As transformers' MiniCPMV4_6ImageProcessorPil prepares an image: an overview (the whole image resized to about
scale² pixels, each side a multiple of 4 patches, scale = the processor's scale_resolution) and, when the image is
larger than one slice, up to max_slices slices: among the grids of n-1, n, n+1 slices (n = the image's area in
slices), the (rows, columns) whose log aspect ratio is closest to the image's (a tie goes to more rows), the
image resized so each slice again has about scale² pixels, cut row by row. Every piece is RGB /255, normalized
by mean and deviation 0.5, and runs through the one static vit net padded to its capacity
(`inputs.slice_inputs`); a piece of h x w patches gives h*w/16 rows. The prompt stands for the image as the
model's processor writes it (`placeholder_ids`): `<image_id>i</image_id>`, `<image>` + the overview's `<unk>`s +
`</image>`, then `<slice>` + a slice's `<unk>`s + `</slice>` per slice, the grid's rows separated by a new line.

The runtime's VisionNet (runtime/vision.py) finds this module through the family registry and calls its hooks
`prepare`, `pixels`, `run_rows` and `image_ids` with itself as `net`. Nothing of the compiler here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.families.minicpmv4_6.inputs import MEAN, STD, best_resize, ensure_divide, rows_of, slice_inputs
from llmbuild.runtime.image_file import open_rgb


@dataclass(frozen=True)
class SlicedImage:
    """One image as MiniCPM-V 4.6 feeds it: pieces [3, h, w] (overview first, then the slices row by row) and
    the slice grid (rows, columns), None when the image is one piece."""

    pieces: tuple[np.ndarray, ...]
    grid: tuple[int, int] | None

    def __len__(self) -> int:
        return len(self.pieces)


def slice_grid(size: tuple[int, int], scale: int, max_slices: int) -> tuple[int, int] | None:
    """(rows, columns) of the slices of an image of (height, width), or None for one that fits one slice."""
    height, width = size
    log_ratio = math.log(width / height)
    multiple = min(math.ceil(width * height / (scale * scale)), max_slices)
    if multiple <= 1:
        return None
    best, best_error = (1, 1), float("inf")
    for count in (multiple - 1, multiple, multiple + 1):
        if count == 1 or count > max_slices:
            continue
        for rows in range(1, count + 1):
            if count % rows == 0:
                error = abs(log_ratio - math.log((count // rows) / rows))
                if error < best_error or (error == best_error and rows > best[0]):
                    best, best_error = (rows, count // rows), error
    return best


def refine_size(size: tuple[int, int], grid: tuple[int, int], scale: int, patch: int) -> tuple[int, int]:
    """(height, width) the image is resized to before it is cut into `grid` (rows, columns) slices."""
    height, width = size
    rows, columns = grid
    h, w = best_resize((ensure_divide(height, rows) / rows, ensure_divide(width, columns) / columns), scale, patch,
                       allow_upscale=True)
    return h * rows, w * columns


def _normalized(image: Any) -> np.ndarray:
    scaled = np.asarray(image, dtype=np.float32) / np.float32(255.0)
    normalized = (scaled - np.asarray(MEAN, np.float32)) / np.asarray(STD, np.float32)
    return np.ascontiguousarray(normalized.transpose(2, 0, 1), dtype=np.float32)


def slice_rgb(image: Any, scale: int, patch: int, max_slices: int) -> SlicedImage:
    """A PIL RGB image as the image processor prepares it."""
    from PIL import Image

    bicubic = Image.Resampling.BICUBIC
    size = (image.size[1], image.size[0])
    grid = slice_grid(size, scale, max_slices)
    h, w = best_resize(size, scale, patch, allow_upscale=grid is None)
    pieces = [_normalized(image.resize((w, h), bicubic))]
    if grid is not None:
        rh, rw = refine_size(size, grid, scale, patch)
        refined = image.resize((rw, rh), bicubic)
        sh, sw = rh // grid[0], rw // grid[1]
        pieces += [_normalized(refined.crop((c * sw, r * sh, (c + 1) * sw, (r + 1) * sh)))
                   for r in range(grid[0]) for c in range(grid[1])]
    return SlicedImage(tuple(pieces), grid)


def from_processor(pixel_values: np.ndarray, target_sizes: np.ndarray, grid: Any, patch: int) -> SlicedImage:
    """One image's pieces out of transformers' image processor output: its NaViT-packed pixel_values
    [1, 3, patch, n*patch], its target_sizes [(h, w), ...] and grid ([0, 0] for one piece)."""
    pieces, start = [], 0
    packed = np.asarray(pixel_values, np.float32)[0]
    for h, w in np.asarray(target_sizes).tolist():
        n = h * w
        run = packed[:, :, start * patch:(start + n) * patch].reshape(3, patch, h, w, patch)
        pieces.append(np.ascontiguousarray(run.transpose(0, 2, 1, 3, 4).reshape(3, h * patch, w * patch)))
        start += n
    rows, columns = (int(g) for g in grid)
    return SlicedImage(tuple(pieces), (rows, columns) if rows and columns else None)


def placeholder_ids(meta: dict[str, Any], image: SlicedImage, index: int, encode: Any) -> list[int]:
    """The ids standing for one image in a prompt, as MiniCPM-V 4.6's processor writes them. `encode`: text
    -> ids (the image index's digits and the new lines between the grid's rows are text)."""
    patch = int(meta["patch_size"])
    unk = int(meta["image_token_id"])
    counts = [rows_of(piece, patch) for piece in image.pieces]
    ids = []
    if meta.get("use_image_id", True):
        ids += [int(meta["image_id_start_id"]), *encode(str(index)), int(meta["image_id_end_id"])]
    ids += [int(meta["image_start_id"]), *[unk] * counts[0], int(meta["image_end_id"])]
    if image.grid is not None:
        rows, columns = image.grid
        for r in range(rows):
            if r:
                ids += encode("\n")
            for n in counts[1 + r * columns: 1 + (r + 1) * columns]:
                ids += [int(meta["slice_start_id"]), *[unk] * n, int(meta["slice_end_id"])]
    return ids


# ---- the hooks of runtime/vision.VisionNet (`net`) ----------------------------------------------------------

def pixels(meta: dict[str, Any], path: str | Path) -> SlicedImage:
    """An image file as the binary's meta.vision says to slice it."""
    return slice_rgb(open_rgb(path), int(meta["scale_resolution"]), int(meta["patch_size"]), int(meta["max_slices"]))


def prepare(net: Any, image: Any) -> SlicedImage:
    """An image file sliced, or pieces already made (a SlicedImage)."""
    if isinstance(image, SlicedImage):
        return image
    if isinstance(image, np.ndarray):
        raise LlmbuildError("a MiniCPM-V 4.6 binary takes image files or SlicedImage pieces "
                            "(llmbuild.families.minicpmv4_6.runtime), not a pixel array")
    return pixels(net.meta, image)


def run_rows(net: Any, prepared: SlicedImage) -> list[np.ndarray]:
    """[h*w/16, hidden] for each piece, the overview's and each slice's: the static net fed the piece padded,
    its first h*w/16 rows."""
    m = net.meta
    patch = int(m["patch_size"])
    return [net.run_net(slice_inputs(piece, patch, int(m["capacity"]), int(m["position_side"])))[
        : rows_of(piece, patch)] for piece in prepared.pieces]


def image_ids(net: Any, image: Any, index: int) -> list[int]:
    """The ids standing for one prepared image in a prompt; `index`: its place in its message."""
    if not isinstance(image, SlicedImage):
        raise LlmbuildError("a MiniCPM-V 4.6 image's ids depend on its slices: pass the prepared image")
    return placeholder_ids(net.meta, image, index, net.encode)

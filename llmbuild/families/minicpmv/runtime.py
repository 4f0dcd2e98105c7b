"""MiniCPM-V 2.6's image slicing and the vit net's per-slice inputs, on Pillow and numpy.

An image becomes an overview (the whole image resized to about scale_resolution² pixels, sides multiples of
the patch size) and, when it is larger than one slice, up to max_slice_nums slices: the grid whose
columns/rows log-ratio is closest to the image's among the grids of n-1, n, n+1 slices (n = the image's
area in slices), the image resized so each slice again has about scale_resolution² pixels, and cut row by
row. Every piece is RGB /255, normalized by mean and deviation 0.5, and runs through the one static vit net,
padded to its `max_patches`: the host fills what MiniCPM-V computes from the piece's (h, w) patch grid
(`inputs.slice_inputs`). The prompt stands for the image as the model's processor writes it
(`placeholder_ids`): `<image_id>i</image_id>`, `<image>` + query_num `<unk>` + `</image>` for the overview,
then one `<slice>` + query_num `<unk>` + `</slice>` per slice, the grid's rows separated by a new line.

The runtime's VisionNet (runtime/vision.py) finds this module through the family registry and calls its
hooks `prepare`, `pixels`, `run_rows` and `image_ids` with itself as `net`; `llmbuild run --bmodel`
(runtime/bmodel_run.py) asks `vendor_feeds` for the bmodel's vit net's inputs. Nothing of the compiler here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.families.minicpmv.inputs import MEAN, STD, best_resize, ensure_divide, slice_inputs, vendor_inputs
from llmbuild.runtime.image_file import open_rgb


@dataclass(frozen=True)
class SlicedImage:
    """One image as MiniCPM-V feeds it: pieces [3, h, w] (overview first, then the slices row by row) and
    the slice grid (columns, rows), None when the image is one piece."""

    pieces: tuple[np.ndarray, ...]
    grid: tuple[int, int] | None

    def __len__(self) -> int:
        return len(self.pieces)


def refine_size(size: tuple[int, int], grid: tuple[int, int], scale: int, patch: int) -> tuple[int, int]:
    """(width, height) the image is resized to before it is cut into `grid` (columns, rows) slices."""
    width, height = size
    columns, rows = grid
    piece = best_resize((ensure_divide(width, columns) / columns, ensure_divide(height, rows) / rows), scale, patch,
                        allow_upscale=True)
    return piece[0] * columns, piece[1] * rows


def slice_grid(size: tuple[int, int], scale: int, max_slices: int) -> tuple[int, int] | None:
    """(columns, rows) of the slices, or None for an image that fits one slice: among the grids of
    multiple-1, multiple, multiple+1 slices (multiple = the image's area over scale², at most max_slices),
    the first (in the published order: slice count, then columns ascending) whose log aspect ratio is
    closest to the image's."""
    width, height = size
    multiple = min(math.ceil(width * height / (scale * scale)), max_slices)
    if multiple <= 1:
        return None
    log_ratio = math.log(width / height)
    best, best_error = (1, 1), float("inf")
    for count in (multiple - 1, multiple, multiple + 1):
        if count == 1 or count > max_slices:
            continue
        for columns in range(1, count + 1):
            if count % columns == 0:
                error = abs(log_ratio - math.log(columns / (count // columns)))
                if error < best_error:
                    best, best_error = (columns, count // columns), error
    return best


def slice_image(image: Any, scale: int, patch: int, max_slices: int) -> tuple[list[Any], tuple[int, int] | None]:
    """The PIL pieces of `image`: [overview, slices row by row...] and the grid (None: one piece)."""
    from PIL import Image

    bicubic = Image.Resampling.BICUBIC
    grid = slice_grid(image.size, scale, max_slices)
    if grid is None:
        return [image.resize(best_resize(image.size, scale, patch, allow_upscale=True), bicubic)], None
    overview = image.resize(best_resize(image.size, scale, patch), bicubic)
    refined = image.resize(refine_size(image.size, grid, scale, patch), bicubic)
    w, h = refined.size[0] // grid[0], refined.size[1] // grid[1]
    slices = [refined.crop((c * w, r * h, (c + 1) * w, (r + 1) * h)) for r in range(grid[1]) for c in range(grid[0])]
    return [overview, *slices], grid


def load_sliced(path: str | Path, scale: int, patch: int, max_slices: int) -> SlicedImage:
    """An image file as MiniCPM-V's processor prepares it: RGB, sliced, each piece /255 and normalized."""
    rgb = open_rgb(path)
    pieces, grid = slice_image(rgb, scale, patch, max_slices)
    arrays = []
    for piece in pieces:
        scaled = np.asarray(piece, dtype=np.float32) / 255.0
        normalized = (scaled - np.asarray(MEAN, np.float32)) / np.asarray(STD, np.float32)
        arrays.append(np.ascontiguousarray(normalized.transpose(2, 0, 1), dtype=np.float32))
    return SlicedImage(tuple(arrays), grid)


def placeholder_ids(meta: dict[str, Any], grid: tuple[int, int] | None, index: int, encode: Any) -> list[int]:
    """The ids standing for one image in a prompt, as MiniCPM-V 2.6's processor writes them. `encode`: text
    -> ids (the image index's digits and the new lines between the grid's rows are text)."""
    unk = [int(meta["image_token_id"])] * int(meta["tokens_per_image"])
    ids = []
    if meta.get("use_image_id"):
        ids += [int(meta["image_id_start_id"]), *encode(str(index)), int(meta["image_id_end_id"])]
    ids += [int(meta["image_start_id"]), *unk, int(meta["image_end_id"])]
    if grid is not None:
        columns, rows = grid
        one = [int(meta["slice_start_id"]), *unk, int(meta["slice_end_id"])]
        for r in range(rows):
            if r:
                ids += encode("\n")
            ids += one * columns
    return ids


# ---- the hooks of runtime/vision.VisionNet (`net`) ----------------------------------------------------------

def pixels(meta: dict[str, Any], path: str | Path) -> SlicedImage:
    """An image file as the binary's meta.vision says to slice it."""
    return load_sliced(path, int(meta["scale_resolution"]), int(meta["patch_size"]), int(meta["max_slices"]))


def prepare(net: Any, image: Any) -> SlicedImage:
    """An image file sliced, or pieces already made (a SlicedImage)."""
    if isinstance(image, SlicedImage):
        return image
    if isinstance(image, np.ndarray):
        raise LlmbuildError("a MiniCPM-V binary takes image files or SlicedImage pieces "
                            "(llmbuild.families.minicpmv.runtime.load_sliced), not a pixel array")
    return pixels(net.meta, image)


def run_rows(net: Any, prepared: SlicedImage) -> list[np.ndarray]:
    """[query_num, hidden] for each piece, the overview's and each slice's: the static net, fed the piece
    padded with the inputs the host computes from its patch grid."""
    m = net.meta
    return [net.run_net(slice_inputs(piece, int(m["patch_size"]), int(m["max_patches"]), int(m["position_side"]),
                                     net.tokens, int(m["embed_dim"])))
            for piece in prepared.pieces]


def image_ids(net: Any, image: Any, index: int) -> list[int]:
    """The ids standing for one prepared image in a prompt; `index`: its place in its message."""
    if not isinstance(image, SlicedImage):
        raise LlmbuildError("a MiniCPM-V image's ids depend on its slices: pass the prepared image")
    return placeholder_ids(net.meta, image.grid, index, net.encode)


def vendor_feeds(meta: dict[str, Any], prepared: SlicedImage, where: str) -> list[list[np.ndarray]]:
    """The bmodel's vit net's inputs for each piece, the overview's and each slice's, in the net's order (as
    LLM-TPU's MiniCPM-V runtime feeds them: inputs.vendor_inputs); each run gives the piece's
    [query_num, hidden] rows. `where` names the image in an error (a piece the net's table cannot address)."""
    return [vendor_inputs(piece, int(meta["patch_size"]), int(meta["max_patches"]), int(meta["position_side"]),
                          int(meta["tokens_per_image"]), where)
            for piece in prepared.pieces]

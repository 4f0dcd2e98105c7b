"""MiniCPM-V 2.6's image slicing and the vit net's per-slice inputs, on Pillow and numpy.

An image becomes an overview (the whole image resized to about scale_resolution² pixels, sides multiples of
the patch size) and, when it is larger than one slice, up to max_slice_nums slices: the grid whose
columns/rows log-ratio is closest to the image's among the grids of n-1, n, n+1 slices (n = the image's
area in slices), the image resized so each slice again has about scale_resolution² pixels, and cut row by
row. Every piece is RGB /255, normalized by mean and deviation 0.5, and runs through the one static vit net,
padded to its `max_patches`: the host fills what MiniCPM-V computes from the piece's (h, w) patch grid
(`slice_inputs`). The prompt stands for the image as the model's processor writes it
(`placeholder_ids`): `<image_id>i</image_id>`, `<image>` + query_num `<unk>` + `</image>` for the overview,
then one `<slice>` + query_num `<unk>` + `</slice>` per slice, the grid's rows separated by a new line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError, one_line

MEAN = STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class SlicedImage:
    """One image as MiniCPM-V feeds it: pieces [3, h, w] (overview first, then the slices row by row) and
    the slice grid (columns, rows), None when the image is one piece."""

    pieces: tuple[np.ndarray, ...]
    grid: tuple[int, int] | None

    def __len__(self) -> int:
        return len(self.pieces)


def ensure_divide(length: float, patch: int) -> int:
    return max(round(length / patch) * patch, patch)


def best_resize(size: tuple[float, float], scale: int, patch: int, allow_upscale: bool = False) -> tuple[int, int]:
    """(width, height) of a piece: about scale² pixels at the image's aspect ratio when it is larger (or
    when upscaling is allowed), each side rounded to a multiple of `patch`."""
    width, height = size
    if width * height > scale * scale or allow_upscale:
        ratio = width / height
        height = int(scale / math.sqrt(ratio))
        width = int(height * ratio)
    return ensure_divide(width, patch), ensure_divide(height, patch)


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
    try:
        from PIL import Image
    except ImportError:
        raise LlmbuildError("reading images needs Pillow: pip install pillow") from None
    try:
        with Image.open(path) as image:
            rgb = image.convert("RGB")
    except FileNotFoundError:
        raise LlmbuildError(f"{path}: image file not found") from None
    except OSError as exc:
        raise LlmbuildError(f"{path}: not an image Pillow can read ({one_line(str(exc))})") from None
    pieces, grid = slice_image(rgb, scale, patch, max_slices)
    arrays = []
    for piece in pieces:
        scaled = np.asarray(piece, dtype=np.float32) / 255.0
        normalized = (scaled - np.asarray(MEAN, np.float32)) / np.asarray(STD, np.float32)
        arrays.append(np.ascontiguousarray(normalized.transpose(2, 0, 1), dtype=np.float32))
    return SlicedImage(tuple(arrays), grid)


def max_patches(scale: int, patch: int) -> int:
    """The most patches a piece of MiniCPM-V's slicing can have for aspect ratios from 1:(scale/patch)² to
    (scale/patch)²:1 (both sides at least one patch before rounding): the vit net's static size. Rounding
    each side to the nearest multiple of the patch can give a few more than (scale/patch)²."""
    side = scale / patch
    best = 1
    for ratio in np.exp(np.linspace(-2 * math.log(side), 2 * math.log(side), 20001)):
        w, h = best_resize((1000.0 * float(ratio), 1000.0), scale, patch, allow_upscale=True)
        best = max(best, (w // patch) * (h // patch))
    return best


def position_ids(grid_h: int, grid_w: int, side: int) -> np.ndarray:
    """The tower's position of each patch, row by row: its fractional coordinates bucketized onto the
    side x side grid of the position table (NaViT, as SigLIP in MiniCPM-V and transformers' Idefics2 do)."""
    boundaries = np.arange(1 / side, 1.0, 1 / side, dtype=np.float32)
    rows = np.clip(np.arange(grid_h, dtype=np.float32) * np.float32(1.0 / grid_h), None, np.float32(1 - 1e-6))
    cols = np.clip(np.arange(grid_w, dtype=np.float32) * np.float32(1.0 / grid_w), None, np.float32(1 - 1e-6))
    bucket_h = np.searchsorted(boundaries, rows, side="right")
    bucket_w = np.searchsorted(boundaries, cols, side="right")
    return (bucket_h[:, None] * side + bucket_w[None, :]).reshape(-1).astype(np.int64)


def slice_inputs(piece: np.ndarray, patch: int, capacity: int, side: int, queries: int, embed_dim: int,
                 where: str = "image") -> dict[str, np.ndarray]:
    """The vit net's inputs for one piece [3, h*patch, w*patch], padded to `capacity` patches: the pixels
    patch by patch ([1, 3, patch, capacity*patch]), the position ids, the tower's and the resampler's
    additive masks (padding keys masked) and the resampler keys' sin-cos table of the (h, w) grid."""
    from llmbuild.frontend.minicpmv import MASKED, sincos_2d

    _, height, width = piece.shape
    grid_h, grid_w = height // patch, width // patch
    n = grid_h * grid_w
    if n > capacity:
        raise LlmbuildError(f"{where}: a slice of {grid_w}x{grid_h} patches is more than the vit net's "
                            f"{capacity} (an aspect ratio this extreme is not supported)")
    patches = piece.reshape(3, grid_h, patch, grid_w, patch).transpose(0, 2, 1, 3, 4).reshape(3, patch, n * patch)
    pixels = np.zeros((1, 3, patch, capacity * patch), np.float32)
    pixels[0, :, :, : n * patch] = patches
    ids = np.zeros((1, capacity), np.int64)
    ids[0, :n] = position_ids(grid_h, grid_w, side)
    keys = np.where(np.arange(capacity) < n, 0.0, MASKED).astype(np.float32)
    pos = np.zeros((1, capacity, embed_dim), np.float32)
    pos[0, :n] = sincos_2d(embed_dim, grid_h, grid_w).reshape(n, embed_dim)
    return {"pixel_values": pixels, "position_ids": ids,
            "attention_mask": np.broadcast_to(keys, (1, 1, capacity, capacity)).copy(),
            "resampler_mask": np.broadcast_to(keys, (1, 1, queries, capacity)).copy(), "pos_embed": pos}


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

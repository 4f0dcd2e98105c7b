"""The `vit` net of a vision-language binary: images in, the rows of the image tokens out (InternVL's
tiles here; a family folder's own image pieces in its `runtime` module, e.g. MiniCPM-V's slices: VisionNet
asks the family registry for it by meta.family).

The vit net has its own plan and weight image (`vision_plan`, `vision_weights`; codegen/vision_plan.py),
so it runs on an executor of its own, the simulated device or the host path like the language model. An
image becomes pixels as the model family defines it (InternVL: RGB, a bicubic resize to the tower's size,
scaled to [0, 1], ImageNet's mean and deviation), the net gives `tokens_per_image` rows of the language
model's width, and the prompt carries `<img>`, that many `<IMG_CONTEXT>` ids and `</img>` for each image:
the runtime copies the rows into the embeddings of those ids before the prefill runs (CompiledModel).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError, one_line
from llmbuild.binary import program as programs
from llmbuild.binary.container import Container
from llmbuild.binary.memory_map import MemoryPlan
from llmbuild.binary.validate import validate_program
from llmbuild.families.registry import family_part_if_any
from llmbuild.runtime.device import Device
from llmbuild.runtime.host import HostExecutor
from llmbuild.runtime.image_file import open_rgb

MASK_INPUT = "attention_mask"


class VisionNet:
    """The binary's vit net on its own executor."""

    def __init__(self, container: Container, meta: dict[str, Any], faithful: bool, lmem_bytes: int | None):
        self.meta = meta
        where = f"{container.path}: section vision_plan"
        try:
            self.plan = MemoryPlan.from_json(bytes(container.section("vision_plan")).decode())
            region = tuple(int(x) for x in self.plan.regions["weight"])
            self.program = programs.decode(container.section(meta["section"]))
            total = self.plan.activation_base + self.program.activation_bytes
            validate_program(self.program, total)
        except LlmbuildError as exc:
            raise LlmbuildError(f"{where}: {exc}") from None
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
            raise LlmbuildError(f"{where}: not the plan of the vit net ({type(exc).__name__}: "
                                f"{one_line(str(exc))})") from None
        weights = container.section("vision_weights")
        self.executor: Device | HostExecutor
        if faithful:
            self.executor = Device(total, region, lmem_bytes, weights=weights)
        else:
            # No decoded-weight cache of its own: the language model's executor holds the process's budget
            # (LLMBUILD_HOST_CACHE_MB), and a 300M tower would add 1.2 GB of float32 on top of it; its weights
            # are decoded tile by tile as each product uses them (the same bits), a small cost next to a tile.
            self.executor = HostExecutor(weights, region, cache_bytes=0)
        self.tokens = int(meta["tokens_per_image"])
        self.family = str(meta.get("family", "internvl"))
        self.size = int(meta.get("image_size", 0))  # InternVL's tile; MiniCPM-V's pieces vary
        # A family folder's runtime part (MiniCPM-V's slicing), else InternVL's tiling below.
        self._own = family_part_if_any(self.family, "runtime")
        self._container = container
        self._tokenizer: Any = None

    # ---- any family: what Session, CompiledModel and the CLI call ----------------------------------------

    def prepare(self, image: Any) -> Any:
        """An image as this family feeds it: a file read and tiled/sliced (`pixels`), or pixels already
        made (InternVL: tiles [tiles, 3, size, size]; MiniCPM-V: its runtime part's SlicedImage)."""
        if self._own is not None:
            return self._own.prepare(self, image)
        if not isinstance(image, str | Path | np.ndarray):
            raise LlmbuildError("an InternVL binary takes image files or tiles [tiles, 3, size, size], not a "
                                f"{type(image).__name__}")
        if isinstance(image, np.ndarray):
            return np.asarray(image, np.float32).reshape(-1, 3, self.size, self.size)
        return self.pixels(image)

    def run_rows(self, prepared: Any) -> list[np.ndarray]:
        """The rows of one prepared image, one array per run of image tokens its placeholder has (InternVL:
        one run for all its tiles; MiniCPM-V: one per piece, the overview's and each slice's)."""
        if self._own is not None:
            return self._own.run_rows(self, prepared)
        return [self.features(prepared)]

    def image_ids(self, image: Any, index: int = 0) -> list[int]:
        """The ids standing for one prepared image in a prompt (InternVL: `image` may be its tile count);
        `index`: the image's place in its message (MiniCPM-V writes it as `<image_id>index</image_id>`)."""
        if self._own is not None:
            return self._own.image_ids(self, image, index)
        return self.tile_ids(image if isinstance(image, int) else len(image))

    # ---- for a family folder's runtime part -------------------------------------------------------------

    def run_net(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The net's `image_features` for one run on `inputs` (every input of the net, by name), batch
        row 0."""
        prog = self.program
        for name, value in inputs.items():
            self.executor.set_input(prog, name, value)
        with np.errstate(over="ignore", under="ignore"):
            self.executor.run(prog)
        return np.asarray(self.executor.get_output(prog, "image_features"), np.float32)[0]

    def encode(self, text: str) -> list[int]:
        """Plain text (an image's index, a new line) as ids, by the binary's tokenizer."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_str(bytes(self._container.section("tokenizer")).decode())
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    # ---- InternVL ---------------------------------------------------------------------------------------

    def features(self, pixels: np.ndarray) -> np.ndarray:
        """[tiles * tokens_per_image, hidden] float32 for one image's tiles [tiles, 3, size, size] (the vit
        net is compiled for one tile: it runs once per tile, and the rows follow in tile order)."""
        prog = self.program
        inputs = {name: prog.tensors[t].shape for name, t in prog.inputs}
        rows = []
        for tile in np.asarray(pixels, np.float32).reshape(-1, 3, self.size, self.size):
            self.executor.set_input(prog, "pixel_values", tile[None])
            if MASK_INPUT in inputs:  # InternViT attends to every patch
                self.executor.set_input(prog, MASK_INPUT, np.zeros(inputs[MASK_INPUT], np.float32))
            with np.errstate(over="ignore", under="ignore"):
                self.executor.run(prog)
            rows.append(np.asarray(self.executor.get_output(prog, "image_features"), np.float32)[0])
        return np.concatenate(rows)

    def tile_ids(self, tiles: int = 1) -> list[int]:
        """The ids one InternVL image of `tiles` tiles takes in a prompt: <img>, tokens_per_image
        <IMG_CONTEXT> per tile, </img>."""
        m = self.meta
        return [int(m["image_start_id"]), *[int(m["image_token_id"])] * (self.tokens * tiles), int(m["image_end_id"])]

    def pixels(self, path: str | Path) -> Any:
        """An image file as this binary's model family prepares it (`load_pixels`; a family folder's runtime
        part's `pixels`, MiniCPM-V's slices)."""
        m = self.meta
        if self._own is not None:
            return self._own.pixels(m, path)
        return load_pixels(path, self.size, m["mean"], m["std"], int(m.get("max_tiles", 1)))


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
    pixels = (scaled - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(pixels.transpose(0, 3, 1, 2), dtype=np.float32)

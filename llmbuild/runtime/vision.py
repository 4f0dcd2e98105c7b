"""The `vit` net of a vision-language binary: images in, the rows of the image tokens out. How an image
becomes the net's inputs and the prompt's placeholders is its family's (InternVL's tiles, MiniCPM-V's slices):
VisionNet asks the family registry for meta.vision.family's `runtime` module and calls its hooks.

The vit net has its own plan and weight image (`vision_plan`, `vision_weights`; codegen/vision_plan.py),
so it runs on an executor of its own, the simulated device or the host path like the language model. The
net gives `tokens_per_image` rows of the language model's width per run, and the runtime copies the rows
into the embeddings of the image tokens before the prefill runs (CompiledModel).
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
from llmbuild.families.registry import family_part
from llmbuild.runtime.device import Device
from llmbuild.runtime.host import HostExecutor


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
            # are decoded a block of rows at a time as each product uses them (the same bits), a small cost
            # next to the product.
            self.executor = HostExecutor(weights, region, cache_bytes=0)
        self.tokens = int(meta["tokens_per_image"])
        family = meta.get("family")
        if not isinstance(family, str):
            raise LlmbuildError(f"{container.path}: meta.vision.family: expected the vision family's name, got "
                                f"{family!r}")
        self.family = family
        self._own = family_part(family, "runtime")  # the family's image preparation and placeholders
        self._container = container
        self._tokenizer: Any = None

    # ---- any family: what Session, CompiledModel and the CLI call ----------------------------------------

    def prepare(self, image: Any) -> Any:
        """An image as this family feeds it: a file read and tiled/sliced (`pixels`), or pixels already
        made (InternVL: tiles [tiles, 3, size, size]; MiniCPM-V: its runtime part's SlicedImage)."""
        return self._own.prepare(self, image)

    def run_rows(self, prepared: Any) -> list[np.ndarray]:
        """The rows of one prepared image, one array per run of image tokens its placeholder has (InternVL:
        one run for all its tiles; MiniCPM-V: one per piece, the overview's and each slice's)."""
        return self._own.run_rows(self, prepared)

    def image_ids(self, image: Any, index: int = 0) -> list[int]:
        """The ids standing for one prepared image in a prompt (InternVL: `image` may be its tile count);
        `index`: the image's place in its message (MiniCPM-V writes it as `<image_id>index</image_id>`)."""
        return self._own.image_ids(self, image, index)

    def pixels(self, path: str | Path) -> Any:
        """An image file as this binary's model family prepares it (its runtime part's `pixels`)."""
        return self._own.pixels(self.meta, path)

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

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        """The net's inputs by name, with their shapes."""
        return {name: self.program.tensors[t].shape for name, t in self.program.inputs}

    def encode(self, text: str) -> list[int]:
        """Plain text (an image's index, a new line) as ids, by the binary's tokenizer."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_str(bytes(self._container.section("tokenizer")).decode())
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

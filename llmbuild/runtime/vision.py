"""The `vit` net of a vision-language binary: images in, the rows of the image tokens out.

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
from llmbuild.runtime.device import Device
from llmbuild.runtime.host import HostExecutor

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
            self.executor = HostExecutor(weights, region)
        self.tokens = int(meta["tokens_per_image"])
        self.size = int(meta["image_size"])

    def features(self, pixels: np.ndarray) -> np.ndarray:
        """[tokens_per_image, hidden] float32 for one image's pixels [1, 3, size, size]."""
        prog = self.program
        inputs = {name: prog.tensors[t].shape for name, t in prog.inputs}
        self.executor.set_input(prog, "pixel_values", pixels)
        if MASK_INPUT in inputs:  # InternViT attends to every patch
            self.executor.set_input(prog, MASK_INPUT, np.zeros(inputs[MASK_INPUT], np.float32))
        with np.errstate(over="ignore", under="ignore"):
            self.executor.run(prog)
        return np.asarray(self.executor.get_output(prog, "image_features"), np.float32)[0]

    def image_ids(self) -> list[int]:
        """The ids one image takes in a prompt: <img>, tokens_per_image <IMG_CONTEXT>, </img>."""
        m = self.meta
        return [int(m["image_start_id"]), *[int(m["image_token_id"])] * self.tokens, int(m["image_end_id"])]


def load_pixels(path: str | Path, size: int, mean: list[float], std: list[float]) -> np.ndarray:
    """An image file as InternVL's processor makes it: RGB, bicubic resize to size x size, /255, normalized
    by the mean and deviation per channel; [1, 3, size, size] float32."""
    try:
        from PIL import Image
    except ImportError:
        raise LlmbuildError("reading images needs Pillow: pip install pillow") from None
    try:
        with Image.open(path) as image:
            rgb = image.convert("RGB").resize((size, size), Image.Resampling.BICUBIC)
    except FileNotFoundError:
        raise LlmbuildError(f"{path}: image file not found") from None
    except OSError as exc:
        raise LlmbuildError(f"{path}: not an image Pillow can read ({one_line(str(exc))})") from None
    pixels = np.asarray(rgb, dtype=np.float32) / 255.0
    pixels = (pixels - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(pixels.transpose(2, 0, 1)[None])

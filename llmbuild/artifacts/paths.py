"""Where each artifact of a recipe's build lives: `build/<recipe>/...` (or $LLMBUILD_BUILD_DIR)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from llmbuild import LlmbuildError
from llmbuild.families.spec import ModelSpec, spec_from_json, spec_to_json
from llmbuild.importer.shapes import Shapes
from llmbuild.locations import build_root
from llmbuild.recipe_types import Recipe


@dataclass(frozen=True)
class BuildPaths:
    root: Path

    @staticmethod
    def of(recipe: Recipe) -> BuildPaths:
        return BuildPaths(build_root() / recipe.name)

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def quantized(self) -> Path:
        """The quantized checkpoint a library writes in the build's quantize step (HF format)."""
        return self.root / "quantized"

    @property
    def spec(self) -> Path:
        return self.root / "spec.json"

    @property
    def reference(self) -> Path:
        return self.root / "reference.safetensors"

    @property
    def dequant_check(self) -> Path:
        """The first and last layers' quantized tensors read by an independent implementation
        (verify/independent_dequant.py), written by the reference step."""
        return self.root / "dequant_check.json"

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

    def layer_dir(self, layer: int) -> Path:
        return self.root / "layers" / str(layer)

    def layer_object(self, layer: int) -> Path:
        return self.layer_dir(layer) / "layer.llmo"

    def layer_metrics(self, layer: int) -> Path:
        return self.layer_dir(layer) / "metrics.json"

    def layer_weights(self, layer: int) -> Path:
        """The layer's device-format weights until link copies them into the binary (a temporary file)."""
        return self.layer_dir(layer) / "weights.safetensors"

    def layer_rounded_scales(self, layer: int) -> Path:
        """The float32 scales of a layer rounded in the build, for its checks (a temporary file)."""
        return self.layer_dir(layer) / "rounded_scales.safetensors"

    @property
    def head_dir(self) -> Path:
        return self.root / "head"

    @property
    def head_object(self) -> Path:
        return self.head_dir / "head.llmo"

    @property
    def head_metrics(self) -> Path:
        return self.head_dir / "metrics.json"

    @property
    def head_weights(self) -> Path:
        return self.head_dir / "weights.safetensors"

    def binary(self, name: str) -> Path:
        return self.root / f"{name}.llmb"

    def bmodel(self, name: str) -> Path:
        """The vendor's deployable binary (docs/bmodel.md)."""
        return self.root / f"{name}.bmodel"

    @property
    def bmodel_dir(self) -> Path:
        """The vendor's per-net compiles and the staged combine (temporary files), its JIT cache, the logs."""
        return self.root / "bmodel"

    def bmodel_net_dir(self, net: str) -> Path:
        return self.bmodel_dir / "nets" / net

    def bmodel_net(self, net: str) -> Path:
        return self.bmodel_net_dir(net) / f"{net}.bmodel"

    def bmodel_layer(self, layer: int) -> Path:
        return self.bmodel_dir / "layers" / f"{layer}.bmodel"

    @property
    def bmodel_head(self) -> Path:
        return self.bmodel_dir / "head.bmodel"

    def bmodel_part_checks(self, part: str) -> Path:
        """A real-size bmodel's checks of one part (`head`, `layer_I`), run before the parts are combined."""
        return self.bmodel_dir / "checks" / f"{part}.json"

    @property
    def bmodel_jit(self) -> Path:
        """The attention kernel's compile cache ($HOME/.ppl of TPU-MLIR's JIT), shared by a build's nets."""
        return self.bmodel_dir / "jit"

    @property
    def bmodel_checks(self) -> Path:
        return self.root / "bmodel.json"

    @property
    def verify(self) -> Path:
        return self.root / "verify.json"

    @property
    def e2e(self) -> Path:
        return self.root / "e2e.json"


def tokenizer_dir(recipe: Recipe, paths: BuildPaths) -> Path:
    if recipe.source.kind == "hf":
        assert recipe.source.path is not None
        return Path(recipe.source.path)
    return paths.checkpoint


def shapes_of(recipe: Recipe) -> Shapes:
    return Shapes(recipe.stages.seq_length, recipe.stages.prefill_length)


def write_spec(spec: ModelSpec, path: Path) -> None:
    write_text_atomic(path, json.dumps(spec_to_json(spec), indent=1, sort_keys=True) + "\n")


def read_spec(path: Path) -> ModelSpec:
    if not path.is_file():
        raise LlmbuildError(f"{path}: missing; run `llmbuild prepare` (or snakemake) first")
    return spec_from_json(json.loads(path.read_text()))


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, data: object) -> None:
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


VIT_NET = "vit"  # the vision tower's net (steps/vision.py writes it, link puts it in the binary)
# lm_head without its top-1, the same weights: what a real-size bmodel's check runs on the vendor's simulator
# in lm_head's place (verify/bmodel_checks.py says why); compiled for the check, never combined.
LM_HEAD_LOGITS_NET = "lm_head_logits"


def vision_dir(paths: BuildPaths) -> Path:
    """Where the vision step writes the vit net's object, weights, plan, metrics and ONNX file."""
    return paths.root / "vision"


def vlm_dir(recipe: Recipe, paths: BuildPaths) -> Path:
    """The whole vision-language checkpoint (what transformers loads as the reference and the tower is
    exported from): an hf source's directory, or the one a synthetic prepare wrote beside the text model."""
    if recipe.source.kind == "hf" and recipe.source.path:
        return Path(recipe.source.path)
    return paths.checkpoint / "vlm"

"""One layer's weights as the compiler consumes them: float, rounded to nearest, or from a quantized
checkpoint. Only this layer's tensors are read (a 7B build never holds the model).

Rounded to nearest in the build, a layer is rounded once, by its layer job: the checks read the levels and
zero points back from the device weight file (exact: levels and zero points are stored as bytes) and the
float32 scales, which the device file holds in bf16, from a small file the layer job writes beside it
(`rounded_scales.safetensors`, 1/16 of the layer's float32 size). Rounding a 1.5B layer again cost its
check job a third of its time. The transformers reference still rounds independently: the checks compare
the two.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.artifacts.paths import BuildPaths
from llmbuild.artifacts.weight_file import weight_file_arrays
from llmbuild.binary.memory_map import MemoryPlan
from llmbuild.families.layout import layer_tensor_names
from llmbuild.families.spec import ModelSpec, TensorSource
from llmbuild.frontend.sources import open_source
from llmbuild.numerics.dequantize import unpack_nibbles
from llmbuild.quant.checkpoint import QuantizedCheckpoint
from llmbuild.quant.quantize_layer import import_layer, quantize_layer
from llmbuild.quant.scheme import QUANTIZED_PROJECTIONS, QuantScheme, layer_projections, recipe_scheme
from llmbuild.recipe_types import LIBRARY_METHODS, Recipe

Weights = dict[str, np.ndarray]


def quantized_checkpoint_dir(recipe: Recipe, paths: BuildPaths) -> Path | None:
    """The quantized checkpoint the build imports: the source itself, or what the quantize step wrote."""
    origin = recipe.quantization.origin
    if origin == "checkpoint":
        assert recipe.source.path is not None
        return Path(recipe.source.path)
    if origin in LIBRARY_METHODS:
        return paths.quantized
    return None


def tensor_source(recipe: Recipe, paths: BuildPaths) -> TensorSource:
    """Where the float tensors (embeddings, norms, biases, lm_head) are read from."""
    if recipe.quantization.origin in LIBRARY_METHODS:
        from llmbuild.frontend.hf import HFSource

        return HFSource(paths.quantized)
    return open_source(recipe.source, paths.checkpoint)


def layer_weights(recipe: Recipe, paths: BuildPaths, spec: ModelSpec, layer: int) -> tuple[Weights, Weights]:
    """(TopOp weights, device weights) of one layer; the same dict twice for float modes."""
    scheme = recipe_scheme(recipe.quantization)
    source = tensor_source(recipe, paths)
    qdir = quantized_checkpoint_dir(recipe, paths)
    names = layer_tensor_names(spec, layer)
    if scheme is None:
        weights = {name: source.tensor(name) for name in names}
        return weights, weights
    if qdir is None:
        return quantize_layer({name: source.tensor(name) for name in names}, layer, scheme)
    projections = layer_projections(layer_tensor_names(spec, layer), layer)
    return import_layer(_float_tensors(source, spec, layer), layer, QuantizedCheckpoint(qdir), scheme, projections)


def _float_tensors(source: TensorSource, spec: ModelSpec, layer: int) -> Weights:
    """The layer's tensors other than the quantized projections' weights (norms, biases)."""
    projections = {f"layers.{layer}.{proj}.weight" for proj in QUANTIZED_PROJECTIONS}
    return {name: source.tensor(name) for name in layer_tensor_names(spec, layer) if name not in projections}


def rounds_in_build(recipe: Recipe) -> bool:
    """Whether the build rounds the projections to nearest itself (a w4/w8 mode without a checkpoint's or
    a library's levels): then the layer job leaves the float32 scales for the checks."""
    return recipe_scheme(recipe.quantization) is not None and recipe.quantization.origin == "rtn"


def write_rounded_scales(path: Path, top: Weights, layer: int) -> None:
    """The float32 scales of a layer's rounded projections (TopOp's; the device file has them in bf16)."""
    from safetensors.numpy import save_file

    names = [f"layers.{layer}.{proj}.scales" for proj in layer_projections(top, layer, ".scales")]
    tmp = path.with_name(path.name + ".tmp")
    save_file({name: np.ascontiguousarray(top[name], dtype=np.float32) for name in names}, str(tmp))
    tmp.replace(path)


def checked_layer_weights(recipe: Recipe, paths: BuildPaths, spec: ModelSpec, plan: MemoryPlan,
                          layer: int) -> Weights:
    """A layer's TopOp weights for its checks: `layer_weights`' first dict, to the bit. A layer rounded in
    the build is read back from what its layer job wrote (levels and zero points from the device weight
    file, float32 scales from the scales file) when that is there, instead of rounded again."""
    from safetensors.numpy import load_file

    scales_file = paths.layer_rounded_scales(layer)
    if not (rounds_in_build(recipe) and scales_file.is_file()):
        return layer_weights(recipe, paths, spec, layer)[0]
    scheme = recipe_scheme(recipe.quantization)
    assert scheme is not None
    top = _float_tensors(tensor_source(recipe, paths), spec, layer)
    device = weight_file_arrays(paths.layer_weights(layer), plan)
    scales = load_file(str(scales_file))
    for proj in layer_projections(scales, layer, ".scales"):
        name = f"layers.{layer}.{proj}"
        top[f"{name}.qweight"] = _levels(device, f"{name}.qweight", scheme, paths.layer_weights(layer))
        top[f"{name}.scales"] = np.asarray(scales[f"{name}.scales"], dtype=np.float32)
        top[f"{name}.zeros"] = device[f"{name}.zeros"].astype(np.float32)
    return top


def _levels(device: dict[str, np.ndarray], name: str, scheme: QuantScheme, path: Path) -> np.ndarray:
    packed = device.get(name)
    if packed is None:
        raise LlmbuildError(f"{path}: tensor {name!r} missing (the layer job's device weights)")
    return unpack_nibbles(packed) if scheme.bits == 4 else np.array(packed, dtype=np.uint8)

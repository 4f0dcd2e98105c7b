"""The quantized projections of one layer, in the two forms the compiler needs.

Weights come either from round-to-nearest in the build (the incumbent's default) or from a quantized
checkpoint (imported as written, or written by a library in the build's `quantize` step). Either way the
result is two views of the same levels: the TopOp weights (levels one per element, float scales and zero
points, act order already sorted into contiguous groups, plus the `.perm` that gathers activations to
match: what `top.A16MatMul` means) and the device weights (4-bit levels packed two per byte, zero points
as bytes: what `tpu.A16MatMul` reads). Nothing is quantized twice: the device form is a repacking.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.quant.checkpoint import QuantizedCheckpoint
from llmbuild.quant.linear import QuantizedLinear
from llmbuild.quant.pack import pack
from llmbuild.quant.rtn import rtn_quantize
from llmbuild.quant.scheme import QuantScheme, layer_projections

Weights = dict[str, np.ndarray]


def quantize_projection(weight: np.ndarray, scheme: QuantScheme) -> QuantizedLinear:
    return rtn_quantize(weight, scheme.bits, scheme.group_for(weight.shape[1]))


def quantize_layer(weights: Weights, layer: int, scheme: QuantScheme) -> tuple[Weights, Weights]:
    """Round-to-nearest: float projections in `weights` -> (top, device) weights."""
    top, device = dict(weights), dict(weights)
    for proj in layer_projections(weights, layer):
        name = f"layers.{layer}.{proj}"
        del device[f"{name}.weight"]
        _add_projection(top, device, name, quantize_projection(top.pop(f"{name}.weight"), scheme), scheme)
    return top, device


def import_layer(weights: Weights, layer: int, checkpoint: QuantizedCheckpoint, scheme: QuantScheme,
                 projections: Sequence[str]) -> tuple[Weights, Weights]:
    """A quantized checkpoint's projections (levels, scales and zero points as written) beside the float
    tensors in `weights` (norms, biases) -> (top, device) weights. `projections`: the layer's quantized
    projections (scheme.layer_projections of its tensor names)."""
    top, device = dict(weights), dict(weights)
    for proj in projections:
        name = f"layers.{layer}.{proj}"
        ql = checkpoint.linear(f"model.{name}")
        where = f"{checkpoint.directory}: {name}"
        if ql.bits != scheme.bits:
            raise LlmbuildError(f"{where}: {ql.bits}-bit levels, expected {scheme.bits} (quantization.mode)")
        if ql.group_size != scheme.group_for(ql.in_features):
            raise LlmbuildError(f"{where}: group size {ql.group_size}, expected {scheme.group_for(ql.in_features)} "
                                "(config.json quantization_config.group_size)")
        _add_projection(top, device, name, ql, scheme)
    return top, device


def _add_projection(top: Weights, device: Weights, name: str, ql: QuantizedLinear, scheme: QuantScheme) -> None:
    packed = pack(ql)
    perm = packed.perm
    if perm is not None and not scheme.act_order:
        raise LlmbuildError(f"{name}: g_idx is not k // group_size (act order) but the checkpoint's "
                            "quantization_config says desc_act is false")
    if scheme.act_order and perm is None:
        perm = np.arange(ql.in_features, dtype=np.int32)  # every layer has the same weights: identity here
    top[f"{name}.qweight"] = ql.q if packed.perm is None else ql.q[:, packed.perm]
    top[f"{name}.scales"] = ql.scale.astype(np.float32)
    top[f"{name}.zeros"] = ql.zero.astype(np.float32)
    device[f"{name}.qweight"] = packed.weight
    device[f"{name}.scales"] = packed.scale
    device[f"{name}.zeros"] = packed.zp
    if scheme.act_order:
        top[f"{name}.perm"] = device[f"{name}.perm"] = perm.astype(np.int32)


def quantize_head(weights: Weights, table: str, scheme: QuantScheme) -> tuple[Weights, Weights]:
    """lm_head's weight `{table}.weight` (the embedding table when tied) rounded to nearest ->
    (top, device) weights; the other head tensors pass through."""
    top, device = dict(weights), dict(weights)
    del device[f"{table}.weight"]
    _add_projection(top, device, table, quantize_projection(top.pop(f"{table}.weight"), scheme), scheme)
    return top, device

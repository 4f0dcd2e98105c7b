"""Weight-only quantization of one layer inside the build (round-to-nearest, the incumbent's default).

Returns two views of the same layer: the TopOp weights (levels one per element, float scales and zero
points: what `top.A16MatMul` means) and the device weights (4-bit levels packed two per byte, zero points
as bytes: what `tpu.A16MatMul` reads). Nothing is quantized twice: the device form is a repacking.
"""

from __future__ import annotations

import numpy as np

from llmbuild.quant.linear import QuantizedLinear
from llmbuild.quant.pack import pack
from llmbuild.quant.rtn import rtn_quantize
from llmbuild.quant.scheme import QUANTIZED_PROJECTIONS, QuantScheme


def quantize_projection(weight: np.ndarray, scheme: QuantScheme) -> QuantizedLinear:
    return rtn_quantize(weight, scheme.bits, scheme.group_for(weight.shape[1]))


def quantize_layer(
    weights: dict[str, np.ndarray], layer: int, scheme: QuantScheme
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    top = dict(weights)
    device = dict(weights)
    for proj in QUANTIZED_PROJECTIONS:
        name = f"layers.{layer}.{proj}"
        ql = quantize_projection(top.pop(f"{name}.weight"), scheme)
        del device[f"{name}.weight"]
        top[f"{name}.qweight"] = ql.q
        top[f"{name}.scales"] = ql.scale.astype(np.float32)
        top[f"{name}.zeros"] = ql.zero.astype(np.float32)
        packed = pack(ql)
        device[f"{name}.qweight"] = packed.weight
        device[f"{name}.scales"] = packed.scale
        device[f"{name}.zeros"] = packed.zp
    return top, device

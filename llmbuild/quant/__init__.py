"""Quantized weights: checkpoint formats (GPTQ, AWQ, AutoRound, compressed-tensors), the incumbent's
round-to-nearest, and the device's packed layout.

    detect_quantization(config)         config.json's quantization_config -> QuantConfigInfo
    QuantizedCheckpoint(dir).linear(p)  one layer of a checkpoint -> QuantizedLinear (canonical, [N, K])
    read_linear(tensors, prefix, info)  the same over any TensorReader
    rtn_quantize(weight, bits, g)       the incumbent's round-to-nearest -> QuantizedLinear
    pack(ql) / unpack(dw)               QuantizedLinear <-> the device layout (+ act-order permutation)

numpy only: no torch, no quantization library is needed to read a checkpoint.
"""

from llmbuild.quant.checkpoint import QuantizedCheckpoint
from llmbuild.quant.config import QuantConfigInfo, detect_quantization
from llmbuild.quant.linear import QuantizedLinear
from llmbuild.quant.pack import DeviceQuantWeights, pack, unpack
from llmbuild.quant.readers import read_linear
from llmbuild.quant.rtn import rtn_quantize
from llmbuild.quant.tensors import DictTensors, SafetensorsDir

__all__ = [
    "DeviceQuantWeights",
    "DictTensors",
    "QuantConfigInfo",
    "QuantizedCheckpoint",
    "QuantizedLinear",
    "SafetensorsDir",
    "detect_quantization",
    "pack",
    "read_linear",
    "rtn_quantize",
    "unpack",
]

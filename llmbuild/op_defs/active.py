"""Active: an activation chosen by mode (TPU-MLIR's Active), from top.SiLU, top.GELU and top.GELUTanh."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from llmbuild.op_defs.op_definition import OpDef, TopForm


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def erf(x: np.ndarray) -> np.ndarray:
    """erf by Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7, about one float32 ulp of 1): numpy
    has no erf, and a vector unit evaluates it as a polynomial like this one too."""
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-x * x))


def gelu(x: np.ndarray) -> np.ndarray:
    return x * 0.5 * (1.0 + erf(x * (1.0 / np.sqrt(2.0))))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    # The tanh form (SigLIP's gelu_pytorch_tanh), in the input's precision as torch computes it.
    c = np.asarray(np.sqrt(2.0 / np.pi), x.dtype)
    return x * 0.5 * (1.0 + np.tanh(c * (x + np.asarray(0.044715, x.dtype) * x * x * x)))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), and x itself above 20 (torch's softplus threshold, where the two agree in float32)."""
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "SILU": silu, "GELU": gelu, "GELU_TANH": gelu_tanh, "SIGMOID": sigmoid, "SOFTPLUS": softplus}


def spec(attrs: dict[str, Any], x: np.ndarray) -> np.ndarray:
    fn = ACTIVATIONS.get(attrs["mode"])
    if fn is None:
        raise NotImplementedError(f"Active mode {attrs['mode']}")
    return fn(x)


ACTIVE = OpDef(
    "Active", 11, "An activation chosen by mode (TPU-MLIR's Active): SILU from top.SiLU, GELU from top.GELU, "
    "GELU_TANH from top.GELUTanh, SIGMOID from top.Sigmoid, SOFTPLUS from top.Softplus.",
    '%g = "tpu.Active"(%x) {mode = "SILU"} : (tensor<1x16x128xbf16>) -> tensor<1x16x128xbf16>',
    shape="Active", grouping="row_local", cost="vector", real_rows="local",
    vector_ops=4,  # exp, add 1, divide, multiply by x (the gate's multiply is its own Mul)
    spec=spec,
    tops=(
        TopForm("SiLU", "Unary", "SiLU, x * sigmoid(x). Lowered to tpu.Active {mode = \"SILU\"}.",
                '%g = "top.SiLU"(%x) : (tensor<1x16x128xf32>) -> tensor<1x16x128xf32>', {"mode": "SILU"}),
        TopForm("GELU", "Unary", "GELU, the exact (erf) form: x / 2 * (1 + erf(x / sqrt(2))). Lowered to "
                "tpu.Active {mode = \"GELU\"}.",
                '%g = "top.GELU"(%x) : (tensor<1x1025x4096xf32>) -> tensor<1x1025x4096xf32>', {"mode": "GELU"}),
        TopForm("GELUTanh", "Unary", "GELU, the tanh form: x / 2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) "
                "(SigLIP's gelu_pytorch_tanh). Lowered to tpu.Active {mode = \"GELU_TANH\"}.",
                '%g = "top.GELUTanh"(%x) : (tensor<1x1024x4304xf32>) -> tensor<1x1024x4304xf32>',
                {"mode": "GELU_TANH"}),
        TopForm("Sigmoid", "Unary", "The logistic function 1 / (1 + exp(-x)): a gate. Lowered to tpu.Active "
                "{mode = \"SIGMOID\"}.",
                '%b = "top.Sigmoid"(%x) : (tensor<1x16x4xf32>) -> tensor<1x16x4xf32>', {"mode": "SIGMOID"},
                exported=False),  # Qwen3.5's gates, whose recipes build no .bmodel yet
        TopForm("Softplus", "Unary", "log(1 + exp(x)), x itself above 20 (torch's threshold). Lowered to "
                "tpu.Active {mode = \"SOFTPLUS\"}.",
                '%s = "top.Softplus"(%x) : (tensor<1x16x4xf32>) -> tensor<1x16x4xf32>', {"mode": "SOFTPLUS"},
                exported=False),
    ),
)

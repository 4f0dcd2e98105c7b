"""A quantized Hugging Face checkpoint directory: its quantization config and its quantized layers."""

from __future__ import annotations

from pathlib import Path

from llmbuild import LlmbuildError
from llmbuild.quant.config import QuantConfigInfo, detect_quantization
from llmbuild.quant.linear import QuantizedLinear
from llmbuild.quant.readers import PRIMARY_TENSOR, check_linear, read_linear
from llmbuild.quant.tensors import SafetensorsDir, _read_json


class QuantizedCheckpoint:
    """config.json + safetensors; `linear(prefix)` reads one layer, e.g. "model.layers.0.mlp.up_proj"."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        config_path = self.directory / "config.json"
        if not config_path.is_file():
            raise LlmbuildError(f"{config_path}: missing; not a Hugging Face checkpoint directory")
        self.config = _read_json(config_path)
        self.info: QuantConfigInfo = detect_quantization(self.config, origin=str(config_path))
        self.tensors = SafetensorsDir(self.directory)
        self._shapes = _float_shapes(self.config)

    def linear_prefixes(self) -> list[str]:
        """Every quantized layer, in file order (found by its packed weight)."""
        suffix = "." + PRIMARY_TENSOR[self.info.layout]
        return [name.removesuffix(suffix) for name in self.tensors.names() if name.endswith(suffix)]

    def expected_shape(self, prefix: str) -> tuple[int, int] | None:
        """(N, K) of the layer from config.json, when its architecture is one llmbuild knows."""
        shape = self._shapes.get(prefix.removeprefix("model.") + ".weight")
        return (shape[0], shape[1]) if shape is not None and len(shape) == 2 else None

    def linear(self, prefix: str) -> QuantizedLinear:
        return read_linear(self.tensors, prefix, self.info, self.expected_shape(prefix))

    def check_linear(self, prefix: str) -> None:
        """The layer's packed tensors against the quantization metadata and config.json, headers only."""
        check_linear(self.tensors, prefix, self.info, self.expected_shape(prefix))


def _float_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Canonical tensor name -> shape for a known architecture; {} otherwise (shapes then come from the
    packed tensors themselves)."""
    from llmbuild.families.layout import expected_shapes
    from llmbuild.families.registry import family_for_hf_model_type, get_family

    try:
        arch = get_family(family_for_hf_model_type(str(config.get("model_type"))))
        return expected_shapes(arch.spec_from_hf_config(config))
    except LlmbuildError:
        return {}

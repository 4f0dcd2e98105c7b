"""A vision-language checkpoint's vision path exported to ONNX through torch.onnx: the `vit` net's source.

InternVL (transformers' native `internvl` layout): the vision tower, its class token dropped, the 2x2 pixel
shuffle and the projector (LayerNorm, Linear, GELU, Linear), which is what replaces the `<IMG_CONTEXT>`
rows of the prompt. transformers' own `InternVLModel.get_image_features` is the code that runs (bound to a
module holding only the tower and the projector, so a 2B model's language model is never built), so the
exported graph is the model's definition, not a re-implementation; `attn_implementation="eager"` makes its
attention the plain softmax(QKᵀ)V the ONNX importer fuses.

Both of torch's exporters work: `legacy` (TorchScript tracing, opset 17) and `dynamo` (torch.export, opset
18, which writes the weights beside the graph as `<name>.onnx.data`); tests/test_onnx_import.py checks that
the two import to graphs that compute the same values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError

EXPORTERS = ("legacy", "dynamo")
# transformers 5 saves the native layout without the "model." its modules carry; some exports keep it.
VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.")


def internvl_vision_module(model_dir: Path) -> tuple[Any, Any]:
    """(module mapping pixel_values [1, 3, S, S] to image features [1, tokens, hidden], its config), with
    only the vision tower's and the projector's weights read from the checkpoint."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModel, InternVLConfig
    from transformers.models.internvl import modeling_internvl as internvl

    config = InternVLConfig.from_pretrained(model_dir)
    config.vision_config._attn_implementation = "eager"

    class InternVLVision(torch.nn.Module):
        pixel_shuffle = internvl.InternVLModel.pixel_shuffle
        get_image_features = internvl.InternVLModel.get_image_features

        def __init__(self) -> None:
            super().__init__()
            self.config = config
            self.vision_tower = AutoModel.from_config(config.vision_config)
            self.multi_modal_projector = internvl.InternVLMultiModalProjector(config)

        @property
        def dtype(self) -> torch.dtype:
            return torch.float32

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            out = self.get_image_features(pixel_values=pixel_values, return_dict=True)
            return out.pooler_output

    module = InternVLVision().eval()
    state = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - a safetensors handle is not a dict
                name = key.removeprefix("model.")
                if name.startswith(VISION_PREFIXES):
                    state[name] = f.get_tensor(key).to(torch.float32)
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise LlmbuildError(f"{model_dir}: missing vision tensor {missing[0]}{more}")
    return module, config


def image_size(model_dir: Path) -> int:
    """The square input size of the vision tower (config.json's vision_config.image_size)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    size = cfg.get("vision_config", {}).get("image_size", 448)
    size = size[0] if isinstance(size, list) else size
    return int(size)


def export_vision_onnx(model_dir: Path, out: Path, exporter: str = "legacy") -> Path:
    """Write the vision path of the checkpoint in `model_dir` to `out` (.onnx) with a fixed image size."""
    import torch

    if exporter not in EXPORTERS:
        raise LlmbuildError(f"vision.exporter: {exporter!r} is not one of {', '.join(EXPORTERS)}")
    module, _ = internvl_vision_module(model_dir)
    size = image_size(model_dir)
    example = torch.zeros(1, 3, size, size)
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(module, (example,), str(out), input_names=["pixel_values"],
                          output_names=["image_features"], opset_version=18 if exporter == "dynamo" else 17,
                          dynamo=exporter == "dynamo")
    return out

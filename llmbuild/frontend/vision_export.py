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

from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError

EXPORTERS = ("legacy", "dynamo")
# transformers 5 saves the native layout without the "model." its modules carry; some exports keep it.
VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.")
ENCODER_LAYERS = "vision_tower.encoder.layer."


def internvl_vision_module(model_dir: Path, layers: bool = True) -> tuple[Any, Any]:
    """(module mapping pixel_values [1, 3, S, S] to image features [1, tokens, hidden], its config), with
    only the vision tower's and the projector's weights read from the checkpoint. `layers=False` leaves the
    encoder layers on the meta device (verify/stream_vlm.py makes them one at a time)."""
    import torch
    from transformers import AutoModel
    from transformers.models.internvl import modeling_internvl as internvl

    from llmbuild.frontend.internvl_chat import TensorView, load_config

    config = load_config(model_dir)  # either layout: the native one's InternVLConfig
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

    # Built on the meta device and given the checkpoint's tensors (assign=True): a 300M tower is held once,
    # not also as a random initialisation (1.2 GB more, and seconds of drawing).
    with torch.device("meta"):
        module = InternVLVision().eval()
    view = TensorView(model_dir)  # native names, read one tensor at a time (a fused qkv split as read)

    def kept(name: str) -> bool:
        return name.startswith(VISION_PREFIXES) and (layers or not name.startswith(ENCODER_LAYERS))

    state = {name.removeprefix("model."): view.get(name) for name in view.names() if kept(name.removeprefix("model."))}
    missing, _ = module.load_state_dict(state, strict=False, assign=True)
    missing = [name for name in missing if kept(name)]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise LlmbuildError(f"{model_dir}: missing vision tensor {missing[0]}{more}")
    left = [name for name, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta and kept(name)]
    if left:  # a part of the tower this module does not know to read
        raise LlmbuildError(f"{model_dir}: vision tensor {left[0]} is not in the checkpoint")
    return module, config


def image_size(model_dir: Path) -> int:
    """The square input size of the vision tower (config.json's vision_config.image_size)."""
    from llmbuild.frontend.internvl_chat import read_native_config

    size = read_native_config(Path(model_dir)).get("vision_config", {}).get("image_size", 448)
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

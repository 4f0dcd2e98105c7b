"""InternVL's torch side: the checkpoint's tensors under transformers' native names in either layout
(`TensorView`), its config as transformers' object (`load_config`), and the vision path as one module
(`vision_module`) whose ONNX export is the `vit` net's source (`export_onnx`).

The original `internvl_chat` layout names its tensors

    vision_model.embeddings.{class_embedding, patch_embedding, position_embedding}
    vision_model.encoder.layers.N.{attn.qkv (q, k, v fused), attn.proj, ls1, ls2, norm1, norm2, mlp.fc1, mlp.fc2}
    mlp1.{0 (LayerNorm), 1 (Linear), 3 (Linear)}
    language_model.model.*, language_model.lm_head.weight

and transformers' conversion script (models/internvl/convert_internvl_weights_to_hf.py) maps them:
`vision_model` -> `vision_tower`, `layers` -> `layer`, `class_embedding` -> `cls_token`,
`position_embedding` -> `position_embeddings`, `patch_embedding` -> `patch_embeddings.projection`, `lsN` ->
`lambda_N`, `attn.proj` -> `attention.projection_layer`, `attn` -> `attention`, `norm1`/`norm2` ->
`layernorm_before`/`layernorm_after`, `mlp1.0/1/3` -> `multi_modal_projector.layer_norm/linear_1/linear_2`,
and `attn.qkv` split in three equal row blocks (q, k, v; weight and bias alike). A Qwen2 language model keeps
its names. Nothing is converted on disk: `TensorView` maps native names to (file, stored name, rows) and reads
one tensor (one third of a fused qkv) when asked, so a 2B checkpoint is never held.

The vision path is the tower, its class token dropped, the 2x2 pixel shuffle and the projector (LayerNorm,
Linear, GELU, Linear), which is what replaces the `<IMG_CONTEXT>` rows of the prompt. transformers' own
`InternVLModel.get_image_features` is the code that runs (bound to a module holding only the tower and the
projector, so a 2B model's language model is never built), so the exported graph is the model's definition,
not a re-implementation; `attn_implementation="eager"` makes its attention the plain softmax(QKᵀ)V the ONNX
importer fuses. Both of torch's exporters work: `legacy` (TorchScript tracing, opset 17) and `dynamo`
(torch.export, opset 18, which writes the weights beside the graph as `<name>.onnx.data`);
tests/test_onnx_import.py checks that the two import to graphs that compute the same values.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError
from llmbuild.families.internvl.config import is_internvl_chat, read_native_config
from llmbuild.frontend.torch_onnx_export import export_tower_onnx
from llmbuild.json_file import read_json

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# transformers 5 saves the native layout without the "model." its modules carry; some exports keep it.
VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.")
ENCODER_LAYERS = "vision_tower.encoder.layer."

# (pattern, replacement) applied in order to a vision_model.* name: the conversion script's table.
_VISION_RULES = (
    (r"^vision_model\.", "vision_tower."),
    (r"\.layers\.", ".layer."),
    (r"\.class_embedding$", ".cls_token"),
    (r"\.position_embedding$", ".position_embeddings"),
    (r"\.patch_embedding\.", ".patch_embeddings.projection."),
    (r"\.ls(\d+)$", r".lambda_\1"),
    (r"\.attn\.proj\.", ".attention.projection_layer."),
    (r"\.attn\.", ".attention."),
    (r"\.norm1\.", ".layernorm_before."),
    (r"\.norm2\.", ".layernorm_after."),
)
_PROJECTOR = {"mlp1.0.": "multi_modal_projector.layer_norm.", "mlp1.1.": "multi_modal_projector.linear_1.",
              "mlp1.3.": "multi_modal_projector.linear_2."}
_QKV = ".attention.qkv."


def load_config(directory: Path) -> Any:
    """transformers' config object for the directory (an InternVLConfig for either InternVL layout)."""
    import transformers

    cfg = read_json(Path(directory) / "config.json")
    if not is_internvl_chat(cfg):
        return transformers.AutoConfig.from_pretrained(Path(directory), local_files_only=True)
    return transformers.InternVLConfig(**read_native_config(directory))


def native_name(stored: str) -> str | None:
    """The native module name (`model.vision_tower...`, `model.multi_modal_projector...`,
    `model.language_model...`, `lm_head.weight`) of an internvl_chat tensor; a fused qkv keeps `qkv`
    (TensorView splits it); None for a tensor of no known part."""
    if stored.startswith("vision_model."):
        name = stored
        for pattern, replacement in _VISION_RULES:
            name = re.sub(pattern, replacement, name)
        return "model." + name
    for old, new in _PROJECTOR.items():
        if stored.startswith(old):
            return "model." + new + stored[len(old):]
    if stored.startswith("language_model.model."):
        return "model.language_model." + stored[len("language_model.model."):]
    if stored.startswith("language_model.lm_head."):
        return stored[len("language_model."):]
    return None


def _module_name(stored: str) -> str:
    """A native-layout tensor's module name: the -hf uploads save `language_model.model.*`, `vision_tower.*`,
    `multi_modal_projector.*` and `language_model.lm_head.*`; transformers 5 saves the module names."""
    if stored.startswith(("language_model.model.", "language_model.lm_head.")):
        return native_name(stored) or stored
    return stored if stored.startswith(("model.", "lm_head.")) else "model." + stored


@dataclass(frozen=True)
class Part:
    """A native tensor: the stored one in `file`, or its row block `part` of `parts` (a split qkv)."""

    file: Path
    stored: str
    part: int = 0
    parts: int = 1


def _stored_files(directory: Path) -> dict[str, Path]:
    from safetensors import safe_open

    index, single = directory / INDEX_FILE, directory / SINGLE_FILE
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise LlmbuildError(f"{index}: missing field 'weight_map'")
        return {name: directory / shard for name, shard in weight_map.items()}
    if single.is_file():
        with safe_open(str(single), framework="pt") as f:
            return dict.fromkeys(f.keys(), single)
    raise LlmbuildError(f"{directory}: no {SINGLE_FILE} or {INDEX_FILE}")


class TensorView:
    """A vision-language checkpoint's tensors under the native module names (`model.vision_tower.*`, ...),
    read one at a time as float32 torch tensors, whichever of the two layouts the directory holds."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.chat = is_internvl_chat(read_json(self.directory / "config.json"))
        self.parts: dict[str, Part] = {}
        for stored, file in sorted(_stored_files(self.directory).items()):
            name = native_name(stored) if self.chat else _module_name(stored)
            if name is None:
                continue
            if _QKV in name:
                for i, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                    self.parts[name.replace(_QKV, f".attention.{proj}.")] = Part(file, stored, i, 3)
            else:
                self.parts[name] = Part(file, stored)

    def names(self, prefix: str = "") -> Iterator[str]:
        return (name for name in self.parts if name.startswith(prefix))

    def get(self, name: str) -> Any:
        """The tensor `name` in float32 (only its rows of a fused qkv are read)."""
        import torch
        from safetensors import safe_open

        part = self.parts.get(name)
        if part is None:
            raise LlmbuildError(f"{self.directory}: missing tensor {name!r}")
        with safe_open(str(part.file), framework="pt") as f:
            sliced = f.get_slice(part.stored)
            if part.parts == 1:
                value = sliced[:]
            else:
                rows = sliced.get_shape()[0]
                if rows % part.parts:
                    raise LlmbuildError(f"{part.file}: tensor {part.stored!r} has {rows} rows, expected a "
                                        f"multiple of {part.parts} (q, k and v fused)")
                block = rows // part.parts
                value = sliced[part.part * block : (part.part + 1) * block]
        return value.to(torch.float32).contiguous()



def vision_module(model_dir: Path, layers: bool = True) -> tuple[Any, Any]:
    """(module mapping pixel_values [1, 3, S, S] to image features [1, tokens, hidden], its config), with
    only the vision tower's and the projector's weights read from the checkpoint. `layers=False` leaves the
    encoder layers on the meta device (stream.py makes them one at a time)."""
    import torch
    from transformers import AutoModel
    from transformers.models.internvl import modeling_internvl as internvl

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
    size = read_native_config(Path(model_dir)).get("vision_config", {}).get("image_size", 448)
    size = size[0] if isinstance(size, list) else size
    return int(size)


def export_onnx(model_dir: Path, out: Path, exporter: str = "legacy") -> Path:
    """Write the vision path of the checkpoint in `model_dir` to `out` (.onnx) with a fixed image size."""
    import torch

    module, _ = vision_module(model_dir)
    size = image_size(model_dir)
    return export_tower_onnx(module, (torch.zeros(1, 3, size, size),), out, ["pixel_values"], exporter)

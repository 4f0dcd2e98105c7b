"""What MiniCPM-V 2.6 and 4.6 share of their vision path, both a SigLIP tower as transformers stores it (2.6
under `vpm.`, 4.6 under `model.vision_tower.`): the tower's tensor shapes from a `vision_config`, the check of
a directory's vision tensors against the shapes its config.json implies (at prepare, in one line naming the
file and the tensor), and loading the stored tensors of a few prefixes into torch modules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError

NORMS = ("weight", "bias")
Shapes = dict[str, tuple[int, ...]]


def linear_shapes(name: str, out: int, inp: int) -> Shapes:
    return {f"{name}.weight": (out, inp), f"{name}.bias": (out,)}


def attention_shapes(prefix: str, width: int) -> Shapes:
    shapes: Shapes = {}
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        shapes |= linear_shapes(f"{prefix}self_attn.{proj}", width, width)
    return shapes


def tower_shapes(prefix: str, vc: Mapping[str, Any]) -> Shapes:
    """The SigLIP tower's tensors under `prefix`: patch and position embeddings, every encoder layer, the
    post-layernorm."""
    width, mlp = int(vc["hidden_size"]), int(vc["intermediate_size"])
    patch, channels = int(vc.get("patch_size", 14)), int(vc.get("num_channels", 3))
    side = int(vc.get("image_size", 224)) // patch
    shapes: Shapes = {
        f"{prefix}embeddings.patch_embedding.weight": (width, channels, patch, patch),
        f"{prefix}embeddings.patch_embedding.bias": (width,),
        f"{prefix}embeddings.position_embedding.weight": (side * side, width),
        **{f"{prefix}post_layernorm.{k}": (width,) for k in NORMS},
    }
    for i in range(int(vc["num_hidden_layers"])):
        layer = f"{prefix}encoder.layers.{i}."
        shapes |= attention_shapes(layer, width)
        shapes |= {f"{layer}{norm}.{k}": (width,) for norm in ("layer_norm1", "layer_norm2") for k in NORMS}
        shapes |= linear_shapes(f"{layer}mlp.fc1", mlp, width) | linear_shapes(f"{layer}mlp.fc2", width, mlp)
    return shapes


def check_vision_tensors(directory: Path, listing: Path, cfg: dict[str, Any], entries: Iterable[Any],
                         expected_shapes: Callable[[dict[str, Any]], Shapes], needs: str) -> None:
    """Every tensor `expected_shapes(cfg)` names is stored, at its shape, in a float type; else one
    LlmbuildError naming the file and the tensor. `listing`: the file that lists the checkpoint's tensors
    (its index, or its one safetensors file); `entries`: its tensors (hf.HFSource.entries(): hf_name, shape,
    dtype, file); `needs`: which fields of config.json imply them, said in the message."""
    directory = Path(directory)
    try:
        expected = expected_shapes(cfg)
    except (KeyError, TypeError, ValueError) as exc:
        raise LlmbuildError(f"{directory / 'config.json'}: vision_config: expected integer hidden_size, "
                            "intermediate_size, num_hidden_layers (and patch_size, image_size), got "
                            f"{type(exc).__name__}: {exc}") from None
    stored = {entry.hf_name: entry for entry in entries}
    for name, shape in expected.items():
        entry = stored.get(name)
        if entry is None:
            raise LlmbuildError(f"{listing}: missing tensor {name!r} ({needs})")
        if tuple(entry.shape) != tuple(shape):
            raise LlmbuildError(f"{entry.file}: tensor {name!r} has shape {list(entry.shape)}, expected "
                                f"{list(shape)} from config.json")
        if not entry.dtype.startswith(("F", "BF")):
            raise LlmbuildError(f"{entry.file}: tensor {name!r} has dtype {entry.dtype}, expected a float type")


def load_prefixed(model_dir: Path, modules: Mapping[str, Any]) -> None:
    """Load each torch module of `modules` (stored prefix -> module) with the directory's tensors under its
    prefix, as float32: each tensor read and copied into the module's own parameter or buffer in turn, so that
    a 400M tower is not held twice (its float32 state beside the module's is 2.1 GB more); tensors the module
    has no place for are not read. LlmbuildError naming the first missing tensor, or one of another shape."""
    import torch
    from safetensors import safe_open

    states = {prefix: module.state_dict() for prefix, module in modules.items()}
    filled: dict[str, set[str]] = {prefix: set() for prefix in modules}
    with torch.no_grad():
        for path in sorted(Path(model_dir).glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - a safetensors handle is not a dict
                    for prefix, state in states.items():
                        name = key.removeprefix(prefix)
                        if not key.startswith(prefix) or name not in state:
                            continue
                        value = f.get_tensor(key)
                        if tuple(value.shape) != tuple(state[name].shape):
                            raise LlmbuildError(f"{path}: tensor {key!r} has shape {list(value.shape)}, expected "
                                                f"{list(state[name].shape)}")
                        state[name].copy_(value.to(torch.float32))
                        filled[prefix].add(name)
    for prefix, state in states.items():
        missing = [name for name in state if name not in filled[prefix]]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise LlmbuildError(f"{model_dir}: missing vision tensor {prefix}{missing[0]}{more}")

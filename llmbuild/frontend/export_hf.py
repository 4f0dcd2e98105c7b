"""Write any TensorSource (a GGUF file, above all) as a float Hugging Face checkpoint directory.

The quantization libraries (gptqmodel, autoawq, auto-round) only read HF checkpoints, so a GGUF source is
exported first. The result is what transformers itself would save: config.json in transformers 5's form,
one model.safetensors under HF names (no `lm_head.weight` when the embeddings are tied: transformers ties
it on load), and the tokenizer files of the prepared checkpoint directory.

Tensors are streamed: the safetensors header is computed from the spec's shapes, then each tensor is read,
converted and written before the next is read, so exporting never holds more than one tensor.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.families.layout import expected_shapes
from llmbuild.families.registry import get_family
from llmbuild.families.spec import ModelSpec, TensorSource

# What a checkpoint directory holds besides the config and the weights, copied as they are.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "generation_config.json",
)
# dtype name -> (safetensors dtype, encoder from float32)
_DTYPES: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    "float32": ("F32", lambda a: a.astype("<f4")),
    "float16": ("F16", lambda a: a.astype("<f2")),
    "bfloat16": ("BF16", lambda a: _bf16_bits(a)),
}
_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}


def export_hf_checkpoint(
    source: TensorSource, spec: ModelSpec, tokenizer_dir: Path, out_dir: Path, dtype: str = "float32"
) -> None:
    """Write `source` as an HF checkpoint in `out_dir`, atomically (all or nothing).

    tokenizer_dir: where the tokenizer files come from (for a GGUF source, the prepared
    `build/<recipe>/checkpoint`). dtype: float32, bfloat16 or float16 for every tensor."""
    from llmbuild.frontend.atomic import atomic_directory
    from llmbuild.frontend.tokenizer_files import write_json

    if dtype not in _DTYPES:
        raise LlmbuildError(f"export_hf_checkpoint: dtype {dtype!r} is not supported; expected {', '.join(_DTYPES)}")
    tokenizer_dir = Path(tokenizer_dir)
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise LlmbuildError(f"{tokenizer_dir / 'tokenizer.json'}: missing; export needs the tokenizer files")
    shapes = expected_shapes(spec)
    available = set(source.names())
    missing = [name for name in shapes if name not in available]
    if missing:
        raise LlmbuildError(f"export_hf_checkpoint: the source has no tensor {missing[0]!r} (the spec needs it)")
    with atomic_directory(Path(out_dir)) as tmp:
        write_json(tmp / "config.json", hf_config_from_spec(spec, dtype))
        hf_shapes = {hf_tensor_name(name): shape for name, shape in shapes.items()}
        canonical = {hf_tensor_name(name): name for name in shapes}
        write_safetensors_streaming(
            tmp / "model.safetensors", hf_shapes, dtype, lambda hf: source.tensor(canonical[hf])
        )
        copy_tokenizer_files(tokenizer_dir, tmp)


def hf_tensor_name(canonical: str) -> str:
    """Canonical name -> transformers' name (the decoder's tensors live under `model.`)."""
    return canonical if canonical.startswith("lm_head.") else "model." + canonical


def hf_config_from_spec(spec: ModelSpec, dtype: str = "float32") -> dict[str, Any]:
    """config.json for `spec`, in the form transformers 5 saves (rope_parameters, dtype); the family's
    unsupported flags (attention_bias, ...) are written false so no reader guesses them."""
    arch = get_family(spec.architecture)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": spec.rope_theta}
    rope.update({key: _plain(value) for key, value in spec.rope_scaling})
    config: dict[str, Any] = {
        "architectures": [arch.hf_class],
        "model_type": arch.hf_model_types[0],
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size,
        "rms_norm_eps": spec.rms_norm_eps,
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_parameters": rope,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype,
        **{flag: False for flag in arch.hf_unsupported_flags},
    }
    if spec.bos_token_id is not None:
        config["bos_token_id"] = spec.bos_token_id
    if spec.eos_token_ids:
        eos = list(spec.eos_token_ids)
        config["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    return config


def write_safetensors_streaming(
    path: Path,
    shapes: Mapping[str, tuple[int, ...]],
    dtype: str,
    read: Callable[[str], np.ndarray],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """A safetensors file of `shapes` (written in sorted name order), each tensor `read(name)` converted
    to `dtype` and written before the next is read. Same bytes for the same inputs."""
    st_dtype, encode = _DTYPES[dtype]
    names = sorted(shapes)
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name in names:
        size = int(np.prod(shapes[name], dtype=np.int64)) * _ITEMSIZE[st_dtype]
        header[name] = {"dtype": st_dtype, "shape": list(shapes[name]), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # the data starts 8-aligned, as safetensors itself pads
    with Path(path).open("wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in names:
            array = np.asarray(read(name), dtype=np.float32)
            if array.shape != tuple(shapes[name]):
                raise LlmbuildError(
                    f"{path}: tensor {name!r} has shape {list(array.shape)}, expected {list(shapes[name])}"
                )
            f.write(np.ascontiguousarray(encode(array)).tobytes())


def copy_tokenizer_files(src: Path, dst: Path) -> list[str]:
    """Copy the tokenizer (and generation config) files `src` has into `dst`; returns their names."""
    copied = []
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            shutil.copyfile(Path(src) / name, Path(dst) / name)
            copied.append(name)
    return copied


def _bf16_bits(array: np.ndarray) -> np.ndarray:
    from llmbuild.numerics.formats import f32_to_bf16_bits

    return f32_to_bf16_bits(array).astype("<u2")


def _plain(value: Any) -> Any:
    """ModelSpec keeps rope_scaling hashable (tuples); JSON wants lists."""
    return [_plain(v) for v in value] if isinstance(value, tuple) else value

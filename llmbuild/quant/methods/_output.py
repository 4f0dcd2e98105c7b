"""Turn what a library saved into llmbuild's quantized checkpoint directory.

Libraries differ in what they leave behind (auto-round writes into a sub-directory named after the
model; gptqmodel adds quantize_config.json and a quant_log.csv of timings; any of them may shard the
weights), and some of it changes from run to run. The directory we write is always the same three kinds
of file, each reproducible to the byte:
- config.json: the library's, with its quantization_config; run-specific fields dropped (`_VOLATILE`),
  written as sorted JSON;
- model.safetensors: every tensor the library saved, in one file, bytes copied unchanged;
- the tokenizer (and generation config) files of the float checkpoint, copied, so the quantized model
  tokenizes exactly as the float one (libraries re-save tokenizers in their transformers' format).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError
from llmbuild.frontend.export_hf import copy_tokenizer_files
from llmbuild.frontend.safetensors_header import read_header
from llmbuild.frontend.tokenizer_files import write_json

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
# quantization_config fields that name a run, not the quantization: gptqmodel's random temporary
# directory (meta.offload_to_disk_path).
_VOLATILE = (("meta", "offload_to_disk_path"),)
# safetensors dtype -> numpy dtype (read_header checks each tensor's byte size with it).
_ALL_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "u1",
}  # fmt: skip


def library_output(work: Path) -> Path:
    """The directory holding the library's config.json (the work directory or one below it)."""
    configs = sorted(Path(work).rglob("config.json"))
    if len(configs) != 1:
        found = ", ".join(str(c.relative_to(work)) for c in configs) or "none"
        raise LlmbuildError(f"{work}: expected the library to save one config.json, found {found}")
    return configs[0].parent


def finish_checkpoint(saved: Path, float_dir: Path, out: Path) -> dict[str, Any]:
    """Write config.json, model.safetensors and the tokenizer files into `out`; returns the cleaned
    quantization_config."""
    config = json.loads((saved / "config.json").read_text(encoding="utf-8"))
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        raise LlmbuildError(f"{saved / 'config.json'}: the library wrote no quantization_config")
    for path in _VOLATILE:
        parent: Any = qc
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
    config.pop("_name_or_path", None)  # where the library loaded from: a temporary path
    write_json(out / "config.json", config)
    merge_safetensors(weight_files(saved), out / WEIGHTS)
    copy_tokenizer_files(float_dir, out)
    return qc


def weight_files(saved: Path) -> list[Path]:
    """The safetensors file(s) a library saved: one file, or the shards its index lists."""
    index = saved / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}
        return [saved / name for name in sorted(set(weight_map.values()))]
    if (saved / WEIGHTS).is_file():
        return [saved / WEIGHTS]
    files = sorted(saved.glob("*.safetensors"))
    if not files:
        raise LlmbuildError(f"{saved}: the library saved no .safetensors weights")
    return files


def merge_safetensors(files: list[Path], out: Path) -> None:
    """One safetensors file holding every tensor of `files` (sorted by name, bytes copied unchanged,
    metadata merged), streamed one tensor at a time."""
    entries: dict[str, tuple[Path, str, tuple[int, ...], int, int]] = {}
    metadata: dict[str, str] = {}
    for path in files:
        for name, (dtype, shape, begin, end) in read_header(path, _ALL_DTYPES).items():
            if name in entries:
                raise LlmbuildError(f"{path}: tensor {name!r} is also in {entries[name][0]}")
            entries[name] = (path, dtype, shape, begin, end)
        metadata.update(_metadata(path))
    metadata.setdefault("format", "pt")  # transformers refuses a file whose format it cannot tell
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for name in sorted(entries):
        _, dtype, shape, begin, end = entries[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + end - begin]}
        offset += end - begin
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    with out.open("wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in sorted(entries):
            path, _, _, begin, end = entries[name]
            with path.open("rb") as src:
                src.seek(begin)
                f.write(src.read(end - begin))


def _metadata(path: Path) -> dict[str, str]:
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(length)).get("__metadata__") or {}
    return {str(k): str(v) for k, v in meta.items()}

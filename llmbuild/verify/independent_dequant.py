"""The checkpoint's quantized tensors read by someone else's code, beside llmbuild's own reader.

The compiler and the reference both unpack a quantized checkpoint through `llmbuild.quant` (nibble order,
act order's g_idx, zero offsets, GPTQ v1's zeros) and a GGUF file through `frontend/gguf_dequant.py`, so a
layout bug there sits on both sides of every other check and passes. Here the first and the last layer's
quantized tensors are dequantized again by an implementation llmbuild did not write, where one is
installed, and compared with llmbuild's reading element for element:

- GPTQ layout (gptqmodel, AutoRound's `auto_gptq` packing): gptqmodel's `convert_gptq_file` (its
  `dequantize_model` tool's path: its own unpacking and v1 zero correction), on a file holding the layer's
  tensors only;
- AWQ layout (AutoAWQ, AutoRound's `auto_awq` packing): AutoAWQ's `dequantize_gemm`, else gptqmodel's
  `convert_awq_file`;
- compressed-tensors `pack-quantized`: compressed-tensors' `PackedQuantizationCompressor.decompress`;
- GGUF: the `gguf` package's `gguf.quants.dequantize` (llama.cpp's reference in Python).

Scales are widened to float32 first on both sides, so each element is one exact product and the two
readings are equal bit for bit when they agree at all. The result goes into `dequant_check.json`; verify
fails a build whose readings differ, naming the tensor. Where no independent implementation is installed,
the file says so and nothing is claimed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from llmbuild import one_line
from llmbuild.artifacts.layer_weights import quantized_checkpoint_dir
from llmbuild.artifacts.paths import BuildPaths, read_spec
from llmbuild.families.layout import layer_tensor_names
from llmbuild.quant.checkpoint import QuantizedCheckpoint
from llmbuild.recipe_types import Recipe

Reader = Callable[[str], np.ndarray]  # a quantized layer's prefix -> its float32 weight [N, K]


def _layers_read(num_layers: int) -> list[int]:
    return sorted({0, num_layers - 1})


def independent_dequantization(recipe: Recipe, paths: BuildPaths) -> dict:
    """What `dequant_check.json` holds: which code read which tensors, and whether they agree."""
    spec = read_spec(paths.spec)
    layers = _layers_read(spec.num_layers)
    qdir = quantized_checkpoint_dir(recipe, paths)
    if qdir is not None:
        return _quantized(QuantizedCheckpoint(qdir), layers)
    if recipe.source.kind == "gguf":
        from llmbuild.frontend.sources import gguf_file

        return _gguf(gguf_file(recipe.source), spec, layers)
    return {"applies": False, "why": "no quantized tensors are read from the source (float weights, or rounded "
                                     "by the build itself)"}


def _compare(names: list[str], ours: Reader, theirs: Reader, library: str) -> dict:
    if not names:  # nothing compared is not "equal"
        return {"applies": True, "library": library, "tensors": [], "equal": None,
                "why": "no quantized tensor of the first and last layers was found under the names read"}
    worst, first = 0.0, None
    for name in names:
        a = ours(name)
        try:
            b = theirs(name)
        except Exception as exc:  # noqa: BLE001  (another project's code: whatever it raises is reported)
            return {"applies": True, "library": library, "tensors": names, "equal": None,
                    "why": f"{library} failed on {name}: {one_line(str(exc))}"}
        if a.shape != b.shape or not np.array_equal(a, b):
            diff = float(np.max(np.abs(a - b))) if a.shape == b.shape else float("inf")
            worst = max(worst, diff) if np.isfinite(diff) else float("inf")
            first = first or name
    return {"applies": True, "library": library, "tensors": names, "equal": first is None,
            "first_differing": first, "max_abs_difference": worst}


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# -- quantized checkpoints ---------------------------------------------------------------------------------

def _quantized(ckpt: QuantizedCheckpoint, layers: list[int]) -> dict:
    wanted = tuple(f"model.layers.{i}." for i in layers)
    prefixes = [p for p in ckpt.linear_prefixes() if p.startswith(wanted)]
    layout = ckpt.info.layout
    found = _library_reader(ckpt)
    if found is None:
        return {"applies": True, "library": None, "equal": None, "tensors": prefixes,
                "why": f"no independent implementation of the {layout!r} layout is installed ({_WANTS[layout]})"}
    library, theirs = found

    def ours(prefix: str) -> np.ndarray:
        return ckpt.linear(prefix).dequantize()

    return _compare(prefixes, ours, theirs, library)


_WANTS = {"gptq": "gptqmodel", "awq": "autoawq or gptqmodel", "pack-quantized": "compressed-tensors"}


def _library_reader(ckpt: QuantizedCheckpoint) -> tuple[str, Reader] | None:
    layout = ckpt.info.layout
    if layout == "gptq" and _installed("gptqmodel"):
        return f"gptqmodel {_version('gptqmodel')} utils.model_dequant.convert_gptq_file", _gptqmodel_gptq(ckpt)
    if layout == "awq" and _installed("awq"):
        return f"autoawq {_version('autoawq')} awq.utils.packing_utils.dequantize_gemm", _autoawq(ckpt)
    if layout == "awq" and _installed("gptqmodel"):
        return f"gptqmodel {_version('gptqmodel')} utils.model_dequant.convert_awq_file", _gptqmodel_awq(ckpt)
    if layout == "pack-quantized" and _installed("compressed_tensors"):
        return (f"compressed-tensors {_version('compressed-tensors')} PackedQuantizationCompressor.decompress",
                _compressed_tensors(ckpt))
    return None


def _torch_tensors(ckpt: QuantizedCheckpoint, prefix: str, suffixes: tuple[str, ...]) -> dict:
    import torch

    out = {}
    for suffix in suffixes:
        name = f"{prefix}.{suffix}"
        if name in ckpt.tensors:
            out[suffix] = torch.from_numpy(np.array(ckpt.tensors.read(name)))
    return out


# Output columns per library call. The libraries widen a whole projection to several int64 and float32
# copies: one call on a 7B's MLP projection (18944 x 3584) held about 3 GB; in blocks of 2048 columns, a
# few hundred MB. A block's result is the columns' own: each column is dequantized from its own levels,
# zero points and scales.
COLUMN_BLOCK = 2048


def _column_blocks(t: dict, bits: int, packed_weight_columns: bool) -> list[dict]:
    """The projection's tensors by blocks of output columns (a multiple of the values a 32-bit word packs):
    `scales` and `qzeros` are [groups, N] and [groups, N / per word] in both layouts; `qweight` is
    [K / per word, N] in GPTQ's layout and [K, N / per word] in AWQ's (`packed_weight_columns`)."""
    per = 32 // bits
    n = t["scales"].shape[1]
    step = max(per, COLUMN_BLOCK // per * per)
    out = []
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        words = slice(lo // per, -(-hi // per))
        part = dict(t, scales=t["scales"][:, lo:hi].contiguous(), qzeros=t["qzeros"][:, words].contiguous())
        part["qweight"] = (t["qweight"][:, words] if packed_weight_columns else t["qweight"][:, lo:hi]).contiguous()
        out.append(part)
    return out


def _one_layer_file(tensors: dict, prefix: str, directory: Path) -> Path:
    """The layer's tensors alone in a safetensors file, for a library tool that reads whole files."""
    from safetensors.torch import save_file

    path = directory / "layer.safetensors"
    save_file({f"{prefix}.{k}": v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def _gptqmodel_gptq(ckpt: QuantizedCheckpoint) -> Reader:
    import torch
    from gptqmodel.utils.model_dequant import convert_gptq_file

    info = ckpt.info
    qc = dict(ckpt.config.get("quantization_config") or ckpt.config)

    def read(prefix: str) -> np.ndarray:
        t = _torch_tensors(ckpt, prefix, ("qweight", "qzeros", "scales", "g_idx"))
        if "g_idx" not in t:  # the tool requires one; without act order row k is in group k // g
            k = t["qweight"].shape[0] * 32 // info.bits
            group = info.group_size if info.group_size > 0 else k
            t["g_idx"] = torch.arange(k, dtype=torch.int32) // group
        t["scales"] = t["scales"].float()
        rows = []
        for part in _column_blocks(t, info.bits, packed_weight_columns=False):
            with tempfile.TemporaryDirectory() as tmp:
                out = convert_gptq_file(_one_layer_file(part, prefix, Path(tmp)), torch.float32, qc, "cpu")
            rows.append(out[prefix + ".weight"].float().numpy())
        return np.concatenate(rows)

    return read


def _autoawq(ckpt: QuantizedCheckpoint) -> Reader:
    from awq.utils.packing_utils import dequantize_gemm

    info = ckpt.info

    def read(prefix: str) -> np.ndarray:
        t = _torch_tensors(ckpt, prefix, ("qweight", "qzeros", "scales"))
        k = t["qweight"].shape[0]
        group = info.group_size if info.group_size > 0 else k
        rows = [dequantize_gemm(part["qweight"], part["qzeros"], part["scales"].float(), info.bits, group)
                .float().numpy().T for part in _column_blocks(t, info.bits, packed_weight_columns=True)]
        return np.concatenate(rows)

    return read


def _gptqmodel_awq(ckpt: QuantizedCheckpoint) -> Reader:
    import torch
    from gptqmodel.utils.model_dequant import convert_awq_file

    def read(prefix: str) -> np.ndarray:
        t = _torch_tensors(ckpt, prefix, ("qweight", "qzeros", "scales"))
        t["scales"] = t["scales"].float()
        rows = []
        for part in _column_blocks(t, ckpt.info.bits, packed_weight_columns=True):
            with tempfile.TemporaryDirectory() as tmp:
                out = convert_awq_file(_one_layer_file(part, prefix, Path(tmp)), torch.float32, "cpu")
            rows.append(out[prefix + ".weight"].float().numpy())
        return np.concatenate(rows)

    return read


def _compressed_tensors(ckpt: QuantizedCheckpoint) -> Reader:
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme

    qc = ckpt.config["quantization_config"]
    group = next(iter(qc["config_groups"].values()))
    scheme = QuantizationScheme(targets=group["targets"], weights=group["weights"])

    def read(prefix: str) -> np.ndarray:
        t = _torch_tensors(ckpt, prefix, ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape",
                                          "weight_g_idx"))
        t["weight_scale"] = t["weight_scale"].float()
        return PackedQuantizationCompressor.decompress(t, scheme)["weight"].float().numpy()

    return read


# -- GGUF --------------------------------------------------------------------------------------------------

def _gguf(path: Path, spec, layers: list[int]) -> dict:
    if not _installed("gguf"):
        return {"applies": True, "library": None, "equal": None, "why": "the gguf package is not installed"}
    from gguf.quants import dequantize

    from llmbuild.frontend.gguf_source import GGUFSource

    source = GGUFSource(path)
    present = set(source.names())
    names = [n for i in layers for n in layer_tensor_names(spec, i) if n in present]
    quantized = [n for n in names if source.tensor_type(n).name not in ("F32", "F16", "BF16")]
    checked = quantized or names

    def theirs(name: str) -> np.ndarray:
        raw, kind, shape = source.stored(name)  # the same stored blocks llmbuild's reader dequantizes
        return np.asarray(dequantize(raw, kind), np.float32).reshape(shape)

    return _compare(checked, source.tensor, theirs, f"gguf {_version('gguf')} gguf.quants.dequantize")


__all__ = ["independent_dequantization"]

"""The vision tower of a vision-language checkpoint as a TopOp net: exported by torch.onnx with the
exporter of the recipe's family, then imported (importer/onnx_net.py). The vision step compiles it into the
.llmb; the vendor bmodel's `vit` net exports the same net to the vendor's dialect."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

from xdsl.dialects.builtin import IntegerAttr, StringAttr, i64

from llmbuild import LlmbuildError
from llmbuild.allocator import release_freed_memory
from llmbuild.families.registry import family_part, vision_family_for_hf_model_type
from llmbuild.frontend.onnx_model import load_onnx
from llmbuild.importer.onnx_net import OnnxImport, import_onnx_net
from llmbuild.recipe_types import Recipe

# Checkpoints up to this size (every weight file of the vision-language directory) export without a worker.
IN_PROCESS_BYTES = 64 << 20


def import_tower(recipe: Recipe, vlm: Path, onnx_path: Path, net: str) -> OnnxImport:
    """The tower exported by torch.onnx to `onnx_path` and imported as the TopOp net `net` (with its
    float32 weights by name)."""
    onnx_path = export_family_onnx(recipe, vlm, onnx_path)
    graph = load_onnx(onnx_path)
    attrs = {"top.stage": StringAttr("vision"), "top.layer": IntegerAttr(-1, i64)}
    imported = import_onnx_net(graph, net, attrs)
    del graph  # its constants: the weights the net did not take as they are (transposed ones are copies)
    release_freed_memory()
    return imported


def export_family_onnx(recipe: Recipe, vlm: Path, out: Path) -> Path:
    """The vit net's ONNX source as the recipe's vision.family defines it (its folder's `model.export_onnx`;
    config.json must be that family's), written by a process of its own, which ends before the graph is read:
    the export holds the torch module in float32 and torch keeps much of it after the module is gone (a
    SigLIP-400M tower left 2.5 GiB resident of its 3.7 GiB peak), where the vision step's later phases need the
    room (the import, the weight image, the checks' reference). A checkpoint of at most IN_PROCESS_BYTES exports
    in this process: what torch keeps of it is small, and a worker would pay torch's and transformers' imports
    a second time (8 s of a tiny tower's 12 s vision step)."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    assert recipe.vision is not None
    family, exporter = recipe.vision.family, recipe.vision.exporter
    model_type = json.loads((vlm / "config.json").read_text(encoding="utf-8")).get("model_type")
    if vision_family_for_hf_model_type(model_type) != family:
        raise LlmbuildError(f"{vlm / 'config.json'}: model_type {model_type!r} is not a checkpoint of "
                            f"vision.family {family} (recipe {recipe.path})")
    if _weight_bytes(vlm) <= IN_PROCESS_BYTES:
        return _export(family, vlm, out, exporter)
    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(_export, family, vlm, out, exporter).result()
    except BrokenProcessPool:
        for written in (out, out.with_name(out.name + ".data")):  # the graph and torch.export's weights file
            written.unlink(missing_ok=True)
        raise LlmbuildError(f"{vlm}: the vision tower's ONNX export ended without finishing (out of memory?); "
                            f"its partial {out.name} was removed") from None


def _weight_bytes(vlm: Path) -> int:
    return sum(f.stat().st_size for pattern in ("*.safetensors", "*.bin") for f in vlm.glob(pattern))


def _export(family: str, vlm: Path, out: Path, exporter: str) -> Path:
    return family_part(family, "model").export_onnx(vlm, out, exporter)


def remove_external_data(onnx_path: Path) -> None:
    """Delete the files that hold an exported ONNX graph's weights outside it: the dynamo exporter's one `.data`
    file, the legacy exporter's one file per tensor (it writes them past protobuf's 2 GB). The net's import read
    them once; the vit net's weights file and the binary hold them from there, so the build directory keeps no
    third copy (1.6 GB for SigLIP-400M). The graph itself stays, to be opened."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    folder = onnx_path.parent.resolve()
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
        path = (folder / location).resolve()
        if location and path.parent == folder:  # only the exporter's own files, beside the graph
            path.unlink(missing_ok=True)


__all__ = ["export_family_onnx", "import_tower", "remove_external_data"]

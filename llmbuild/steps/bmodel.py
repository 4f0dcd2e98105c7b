"""The vendor's `.bmodel`, built from the same TopOp nets and the same weights as the `.llmb`:

- `llmbuild bmodel-net RECIPE --net NET`: one net (`block_i`, `block_kv_i`, `block_cache_i`, `embedding`,
  `embedding_cache`, `lm_head`; `vit` for a vision-language recipe) imported as TopOp exactly as the layer,
  head and vision steps import it, exported to the vendor's top dialect with its weights (bmodel/top_export.py,
  bmodel/vit_export.py, a vision family's `vendor` part), compiled by TPU-MLIR's `tpuc-opt`
  (bmodel/vendor_compile.py) into `bmodel/nets/NET/NET.bmodel`; the vendor's intermediate files (float32
  npz, tpu modules) are deleted once the bmodel is written.
- `llmbuild bmodel-combine RECIPE --layer I | --head | --model`: steps/bmodel_combine.py.

Each net is a job of its own, so a change that touches one net recompiles that net, and the nets of a
real-size model compile in parallel, each holding one layer's weights.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from llmbuild import LlmbuildError
from llmbuild.allocator import release_freed_memory
from llmbuild.artifacts.layer_weights import checked_layer_weights, layer_weights, rounds_in_build, tensor_source
from llmbuild.artifacts.paths import LM_HEAD_LOGITS_NET, VIT_NET, BuildPaths, read_spec, shapes_of, vlm_dir
from llmbuild.binary.memory_map import MemoryPlan
from llmbuild.bmodel.top_export import DynamicPrefill, FinalNorm, export_net
from llmbuild.bmodel.vendor_compile import NetOptions, compile_net
from llmbuild.bmodel.vendor_ir import VendorModule
from llmbuild.bmodel.vit_export import export_vit
from llmbuild.chips import load_chip
from llmbuild.families.spec import ModelSpec
from llmbuild.importer.nets import ROPE_COS, ROPE_SIN, head_net
from llmbuild.importer.rope import rope_tables
from llmbuild.passes import run_passes
from llmbuild.passes.canonicalize import Canonicalize
from llmbuild.quant.scheme import head_scheme, recipe_scheme
from llmbuild.recipe_types import Recipe
from llmbuild.steps import dag
from llmbuild.steps.resources import vocab_table_parts
from llmbuild.vendor_toolchain import locate

HEAD_NETS = dag.BMODEL_HEAD_NETS
_BLOCK = dag.BMODEL_BLOCK_NET
# The vendor's mode word for an activation type.
_ACTIVATION = {"f32": "F32", "bf16": "BF16", "f16": "F16"}


def net_names(recipe: Recipe, spec: ModelSpec) -> list[str]:
    """Every net of the recipe's bmodel: per layer its stages, then the head nets (and the vit net)."""
    return [n for i in range(spec.num_layers) for n in layer_net_names(recipe, i)] + head_net_names(recipe)


def head_net_names(recipe: Recipe) -> list[str]:
    return dag.head_net_names(recipe.vision is not None)


def layer_net_names(recipe: Recipe, layer: int) -> list[str]:
    """A layer's nets: prefill and decode, and prefill on a history in the history form (`bmodel.history`)."""
    return dag.layer_net_names(recipe.bmodel.history, layer)


def dynamic_prefill(recipe: Recipe) -> DynamicPrefill | None:
    """The history form's mask size: the vendor's, four rows per lane of the chip."""
    if not recipe.bmodel.history:
        return None
    return DynamicPrefill(4 * load_chip(recipe.target.chip).npu_lanes)


def activation_type(recipe: Recipe) -> str:
    mode = recipe.quantization.mode
    return mode[2:] if mode.startswith("w") else mode  # w4bf16 -> bf16, w8f16 -> f16


def net_options(recipe: Recipe, net: str, bits: int | None, group: int) -> NetOptions:
    """How TPU-MLIR compiles `net`: the recipe's activation type, W<bits> where the net multiplies by levels,
    the decode nets' KV cache addressed apart (LLM-TPU writes the new row into it), lm_head's output (the
    token id) left unconverted, the vit net's input (float32 pixels) too, the history form's prefill nets
    with run-time lengths."""
    act = _ACTIVATION[activation_type(recipe)]
    mode = f"W{bits}{act}" if bits else act
    prefill = net.startswith(("block_", "block_kv_")) and not net.startswith("block_cache_")
    return NetOptions(chip=recipe.target.chip, mode=mode, q_group_size=group if bits else 0,
                      io_alone=net.startswith("block_cache_"), quant_output=net not in ("lm_head", LM_HEAD_LOGITS_NET),
                      quant_input=net != VIT_NET,
                      num_core=recipe.bmodel.cores, dynamic=prefill and recipe.bmodel.history)


@dataclass
class NetSource:
    """A net's TopOp module and the weights it names (TopOp's: levels unpacked, float32 scales)."""

    module: ModuleOp
    weights: Mapping[str, np.ndarray]
    final_norm: FinalNorm | None


def net_source(recipe: Recipe, paths: BuildPaths, spec: ModelSpec, net: str) -> NetSource:
    match = _BLOCK.match(net)
    if match:
        from llmbuild.importer.nets import build_block

        layer = int(match.group(2))
        if layer >= spec.num_layers:
            raise LlmbuildError(f"net {net}: the model has {spec.num_layers} layers")
        stage = {"block": "prefill", "block_kv": "prefill_kv", "block_cache": "decode"}[match.group(1)]
        shapes = shapes_of(recipe)
        module = build_block(spec, layer, stage, shapes, recipe_scheme(recipe.quantization))
        weights = dict(_layer_top_weights(recipe, paths, spec, layer))
        weights[ROPE_COS], weights[ROPE_SIN] = rope_tables(spec, shapes.seq_length)
        final = None
        if layer == spec.num_layers - 1:
            gamma = tensor_source(recipe, paths).tensor("norm.weight")
            final = FinalNorm(np.asarray(gamma, np.float32), spec.rms_norm_eps)
        return NetSource(module, weights, final)
    if net == VIT_NET:
        return vit_source(recipe, paths)
    if net in HEAD_NETS or net == LM_HEAD_LOGITS_NET:
        # Only `embedding` reads a stage shape (the prefill length); the vendor's head nets take no RoPE table.
        # lm_head's twin is lm_head's TopOp net; only its vendor form ends before the top-1 (build_net).
        prefill = recipe.stages.prefill_length if net == "embedding" else 1
        module = head_net(spec, "lm_head" if net == LM_HEAD_LOGITS_NET else net, prefill,
                          head_scheme(recipe.quantization))
        from llmbuild.artifacts.head_weights import head_weights  # the head's nets only: 0.12 s of imports

        top_weights, _ = head_weights(recipe, paths, spec, None)  # large tables as RowReaders, read when used
        return NetSource(module, top_weights, None)
    raise LlmbuildError(f"net {net!r}: expected block_I, block_kv_I, block_cache_I, {VIT_NET}, "
                        f"{LM_HEAD_LOGITS_NET} or one of {', '.join(HEAD_NETS)}")


def _layer_top_weights(recipe: Recipe, paths: BuildPaths, spec: ModelSpec, layer: int) -> Mapping[str, np.ndarray]:
    """The layer's TopOp weights: where the build rounds the projections itself and the layer's job has
    written them (the rule waits for it: dag.bmodel_layer_files), its levels and scales read back, to the
    bit what rounding them again gives (artifacts/layer_weights.checked_layer_weights: 0.3 s of each of a
    1.5B's 56 block jobs); else made as that job makes them."""
    if rounds_in_build(recipe) and paths.layer_weights(layer).is_file() and paths.plan.is_file():
        return checked_layer_weights(recipe, paths, spec, MemoryPlan.read(paths.plan), layer)
    return layer_weights(recipe, paths, spec, layer)[0]


def vit_source(recipe: Recipe, paths: BuildPaths) -> NetSource:
    """The vision tower as the vision step imports it, exported again into the net's own directory (the
    vision step keeps no copy of a dynamo export's weights)."""
    from llmbuild.families.registry import family_part
    from llmbuild.importer.vision_tower import import_tower

    if recipe.vision is None:
        raise LlmbuildError(f"net {VIT_NET}: exported for a vision-language recipe (set vision.family)")
    refused = family_part(recipe.vision.family, "family").NO_VENDOR_EXPORT
    if refused:
        raise LlmbuildError(f"net {VIT_NET}: not exported for {refused}")
    net = import_tower(recipe, vlm_dir(recipe, paths), paths.bmodel_net_dir(VIT_NET) / "vit.onnx", VIT_NET)
    return NetSource(net.module, net.weights, None)


def vit_module(recipe: Recipe, paths: BuildPaths, source: NetSource, weight_file: str) -> VendorModule:
    """The vit net in the vendor's dialect: by the vision family's own `vendor` part where it has one (the
    inputs its LLM-TPU runtime feeds: MiniCPM-V's), else as the tower's graph gives it (InternVL: a tile's
    pixels)."""
    from llmbuild.families.registry import family_part_if_any

    assert recipe.vision is not None
    own = family_part_if_any(recipe.vision.family, "vendor")
    if own is not None:
        return own.export_vit(source.module, source.weights, weight_file, vlm_dir(recipe, paths))
    return export_vit(source.module, source.weights, weight_file)


def build_net(recipe: Recipe, net: str) -> None:
    chain = locate()  # first: a missing toolchain is one line before any weight is read
    paths = BuildPaths.of(recipe)
    spec = read_spec(paths.spec)
    out_dir = paths.bmodel_net_dir(net)
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    source = net_source(recipe, paths, spec, net)
    run_passes(source.module, [Canonicalize()])
    weight_file = f"{net}_top_weights.npz"
    if net.startswith("block_kv_") and not recipe.bmodel.history:
        raise LlmbuildError(f"net {net}: the recipe's bmodel has no history nets (bmodel.history is false)")
    if net == VIT_NET:
        vendor = vit_module(recipe, paths, source, weight_file)
    else:
        # Only the block nets have a history form: the head's nets do not read `bmodel.history`.
        dynamic = dynamic_prefill(recipe) if _BLOCK.match(net) else None
        act = activation_type(recipe)
        vendor = export_net(source.module, source.weights, weight_file, source.final_norm,
                            dynamic, explicit_attention=act == "f32", table_storage=None if act == "f32" else act,
                            table_parts=vocab_table_parts(recipe, spec),
                            logits_net=net if net == LM_HEAD_LOGITS_NET else None)
    (out_dir / f"{net}.mlir").write_text(vendor.text())
    np.savez(out_dir / weight_file, **vendor.weights)
    bits, group = _quantized(source.module)
    options = net_options(recipe, net, bits, group)
    # The weights are in the npz now: freed before tpuc-opt reads them again (a 7B's lm_head table is 1.1 GB
    # in bf16, which the job would otherwise hold twice).
    del vendor, source
    release_freed_memory()
    try:
        compile_net(chain, out_dir, net, options, jit_cache(paths), out_dir / "tpuc.log")
    finally:
        _remove_intermediates(out_dir, net)


def jit_cache(paths: BuildPaths) -> Path:
    """The attention kernel's JIT cache: in the build directory, shared by its nets. The vendor's JIT builds
    with cmake and make, which cannot take a path with a space or a shell character: such a build directory
    gets its cache under the system's temporary directory instead, one per build directory."""
    cache = paths.bmodel_jit.resolve()
    if re.fullmatch(r"[A-Za-z0-9_./+-]+", str(cache)):
        return cache
    digest = hashlib.sha256(str(cache).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"llmbuild-ppl-jit-{os.getuid()}-{digest}"


def _quantized(module: ModuleOp) -> tuple[int | None, int]:
    """The weight bits and group of the net's A16MatMul ops (one scheme per net), or (None, 0)."""
    for op in module.walk():
        if op.name == "top.A16MatMul":
            return op.attributes["weight_bits"].value.data, op.attributes["q_group_size"].value.data  # type: ignore[attr-defined]
    return None, 0


def _remove_intermediates(out_dir, net: str) -> None:
    """Keep the bmodel, the vendor-dialect module a person can open, and the log; the rest is the vendor's
    scratch (float32 npz of the weights, tpu modules, layer-group caches, profiles)."""
    keep = {f"{net}.bmodel", f"{net}.mlir", "tpuc.log"}
    for path in out_dir.iterdir():
        if path.name not in keep:
            shutil.rmtree(path) if path.is_dir() else path.unlink()


__all__ = ["HEAD_NETS", "build_net", "net_names", "net_options"]

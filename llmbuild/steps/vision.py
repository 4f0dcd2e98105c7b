"""`llmbuild vision RECIPE`: the `vit` net of a vision-language model, exported, imported, compiled, checked.

    checkpoint/vlm ──torch.onnx──▶ vision/vit.onnx ──import──▶ vision/top_vit.mlir (TopOp)
        ──lower, assign-address (its own plan), layer-group──▶ vision/tpu_vit.mlir, vision/vision.llmo
        + vision/weights.safetensors (device format), vision/plan.json, vision/metrics.json

The check runs the compiled program on the simulated device (layer groups, local memory, addresses: what
the chip runs) and on the host path, for fixed pseudo-random inputs (verify/vision_cases.py: an InternVL
tile; MiniCPM-V pieces of several patch grids, padded as the runtime pads them), and compares the image
features with the reference on the same weights (transformers' own `get_image_features`; MiniCPM-V's tower
and resampler at the piece's own size) (cosine at least `vision.image_cosine`, the worst case); when
they part, the first op whose output parts from the TopOp interpretation is named. Like a layer's checks,
NaN or Inf never passes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.allocator import release_freed_memory
from llmbuild.artifacts.paths import VIT_NET, BuildPaths, vision_dir, vlm_dir, write_json, write_text_atomic
from llmbuild.artifacts.weight_file import write_weight_file
from llmbuild.binary.container import write_container
from llmbuild.binary.memory_map import MemoryPlan
from llmbuild.binary.program import encode
from llmbuild.chips import load_chip
from llmbuild.codegen.vision_plan import make_vision_plan
from llmbuild.importer.vision_tower import import_tower, remove_external_data
from llmbuild.recipe_types import Recipe
from llmbuild.steps.compile_net import compile_net
from llmbuild.steps.weights_blob import weight_chunk
from llmbuild.verify.similarity import cosine
from llmbuild.verify.vision_cases import check_cases


def build_vision(recipe: Recipe) -> None:
    if recipe.vision is None:
        raise LlmbuildError(f"{recipe.path}: vision: this recipe has no vision tower (set vision.family)")
    paths = BuildPaths.of(recipe)
    out = vision_dir(paths)
    out.mkdir(parents=True, exist_ok=True)
    vlm = vlm_dir(recipe, paths)
    net = import_tower(recipe, vlm, out / "vit.onnx", VIT_NET)
    remove_external_data(out / "vit.onnx")  # read once: the weights file and the binary hold them from here
    mode, chip = recipe.quantization.mode, recipe.target.chip
    plan = make_vision_plan(net.module, mode, load_chip(chip).global_alignment)
    top_module = net.module.clone()
    write_text_atomic(out / "plan.json", plan.to_json())  # what the compile's assign-address reads
    compiled = compile_net(net.module, out / "plan.json", mode, chip, out)
    write_weight_file(out / "weights.safetensors", plan, net.weights)
    write_container(out / "vision.llmo", [(f"net:{VIT_NET}", [encode(compiled.program)])])
    image = weight_chunk(plan, net.weights)
    # The float32 weights (2.1 GB for SigLIP-400M) are not held through the checks: only a failing check needs
    # them again, to name the first op that parts, and it imports the tower again.
    del net
    release_freed_memory()  # the compile's temporaries, before the check's device image and reference
    metrics = check_vision(recipe, vlm, compiled, top_module, image, plan,
                           lambda: _imported_again(recipe, vlm, out))
    write_json(out / "metrics.json", metrics)
    print(f"{recipe.name}: vit net, {len(compiled.program.instrs)} ops in {len(compiled.program.groups)} "
          f"layer groups; image features cosine {metrics['cosine_device']:.7f} (device) against the reference")


def _imported_again(recipe: Recipe, vlm: Path, out: Path) -> dict[str, np.ndarray]:
    """The tower's TopOp weights, exported and imported again (names are the export's, the same each time)."""
    weights = import_tower(recipe, vlm, out / "vit.onnx", VIT_NET).weights
    remove_external_data(out / "vit.onnx")
    return weights


def check_vision(recipe: Recipe, vlm: Path, compiled, top_module, image: tuple[int, bytearray], plan: MemoryPlan,
                 float_weights: Callable[[], dict[str, np.ndarray]]) -> dict:
    """`image`: the weight region's base and bytes; `float_weights`: the TopOp's weights, asked for only when a
    check fails."""
    from llmbuild.dialects.interpret import interpret
    from llmbuild.runtime.device import Device
    from llmbuild.runtime.host import HostExecutor

    assert recipe.vision is not None
    prog = compiled.program
    shapes = {name: prog.tensors[t].shape for name, t in prog.inputs}
    cases = check_cases(recipe.vision.family, vlm, shapes)
    base, blob = image
    region = tuple(plan.regions["weight"])
    if base != region[0]:
        raise LlmbuildError(f"{recipe.path}: the vit net's weights start at {base}, not at their region's {region[0]}")
    size = plan.activation_base + prog.activation_bytes
    # The device reads the weight image in place, as it reads a binary's mapped section: one copy of it, shared
    # with the host path, instead of a second in the device's memory.
    device = Device(size, region, load_chip(recipe.target.chip).lmem_bytes, weights=blob)
    # No decoded-weight cache: a 300M tower's weights would be decoded to 1.2 GB of float32 beside the f32
    # TopOp weights and the device's image; decoded tile by tile, the same bits (tests/test_host_path.py).
    host = HostExecutor(blob, region, cache_bytes=0)
    per_case, equal = {}, True
    for case, inputs, want in cases:
        got = {}
        for name, executor in (("device", device), ("host", host)):
            for key, value in inputs.items():
                executor.set_input(prog, key, value)
            executor.run(prog)
            # The rows the reference has: a MiniCPM-V 4.6 piece fills h*w/16 of the net's rows, the rest are
            # its padding's (every other family's reference has all of them).
            got[name] = executor.get_output(prog, "image_features")[:, : want.shape[1]]
        per_case[case] = {name: cosine(value, want) for name, value in got.items()}
        equal = equal and bool(np.array_equal(got["device"], got["host"]))
    # The worst case decides (a NaN cosine is -1: it fails).
    case, inputs, want = min(cases, key=lambda c: min(per_case[c[0]].values()))
    cosines = per_case[case]
    metrics = {"cosine_device": min(c["device"] for c in per_case.values()),
               "cosine_host": min(c["host"] for c in per_case.values()), "host_equals_device": equal,
               "threshold": recipe.vision.image_cosine, "tokens": int(want.shape[1]), "ops": len(prog.instrs),
               "groups": len(prog.groups)}
    if len(cases) > 1:
        metrics["cases"] = per_case
    worst = min(cosines.values())
    if not worst >= recipe.vision.image_cosine:  # NaN fails too
        del device, host
        weights = float_weights()
        reference = interpret(top_module, inputs, weights.__getitem__, reference=True)
        first = _first_parting_op(compiled.tpu, inputs, weights, reference)
        where = f" ({case})" if len(cases) > 1 else ""
        raise LlmbuildError(f"{recipe.path}: vision.image_cosine: the vit net's image features{where} have cosine "
                            f"{worst:.7f} against the reference, expected at least {recipe.vision.image_cosine}"
                            f"{first}")
    return metrics


def _first_parting_op(tpu_module, inputs: dict, weights: dict, reference) -> str:
    from llmbuild.dialects.interpret import interpret

    run = interpret(tpu_module, inputs, weights.__getitem__, reference=False)
    for loc in run.order:
        if loc in reference.by_loc and cosine(run.by_loc[loc], reference.by_loc[loc]) < 0.999:
            return f"; first op apart from the TopOp interpretation: {loc}"
    return ""

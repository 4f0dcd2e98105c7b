"""`llmbuild link RECIPE`: one deployable binary from the head object and every layer object.

The weight image is streamed chunk by chunk in address order (never the whole model in memory); each
layer's weights appear once and are shared by its three stage programs. The build fails here, with the
numbers, when the chip's device memory cannot hold weights + KV cache + IO + activations. Next to the
binary it writes memory.json and perf.json (the compiled groups timed, `llmbuild.cost.compiled`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError, __version__
from llmbuild.artifacts.paths import BuildPaths, read_spec, shapes_of, tokenizer_dir, write_json
from llmbuild.artifacts.weight_file import weight_file_tensors
from llmbuild.binary.container import Container, FileSpan, write_container
from llmbuild.binary.layer_streams import SlotNames, stream_key
from llmbuild.binary.memory_map import MemoryPlan, align
from llmbuild.binary.program import Program, decode, decode_header
from llmbuild.chips import load_chip
from llmbuild.cost.compiled import perf_report
from llmbuild.families.registry import family_part
from llmbuild.families.spec import spec_to_json
from llmbuild.frontend.tokenizer_files import TokenizerBundle, read_tokenizer_bundle, token_ids_by_string
from llmbuild.recipe_types import Recipe
from llmbuild.verify.layer_check_policy import faithful_layers


def _weight_image(files: list[Path], plan: MemoryPlan) -> Iterator[bytes | FileSpan]:
    """The weight region's bytes in address order: each tensor as its span of its layer's weight file
    (copied file to file by the writer), zeros in the gaps."""
    tensors = sorted((t for path in files for t in weight_file_tensors(path, plan)), key=lambda t: t.address)
    size = plan.regions["weight"][1]
    cursor = 0
    for t in tensors:
        if t.address < cursor:
            raise LlmbuildError(f"weight {t.name} at {t.address:#x} overlaps the previous one")
        if t.address > cursor:
            yield bytes(t.address - cursor)
        yield FileSpan(t.path, t.begin, t.end)
        cursor = t.address + t.nbytes
    if cursor > size:
        raise LlmbuildError(f"weight image ends at {cursor:#x}, past the planned region {size:#x}")
    missing = sorted(set(plan.weights) - {t.name for t in tensors})
    if missing:
        raise LlmbuildError(f"no object holds weight {missing[0]!r} (and {len(missing) - 1} more)")
    yield bytes(size - cursor)


def memory_report(plan: MemoryPlan, activation_bytes: int, device_bytes: int) -> dict:
    regions = {name: {"base": base, "bytes": size} for name, (base, size) in plan.regions.items()}
    regions["activation"] = {"base": plan.activation_base, "bytes": align(activation_bytes, plan.alignment)}
    total = plan.activation_base + regions["activation"]["bytes"]
    return {"regions": regions, "total_bytes": total, "device_bytes": device_bytes}


def check_fits(recipe: Recipe, report: dict) -> None:
    total, limit = report["total_bytes"], report["device_bytes"]
    if total > limit:
        parts = ", ".join(f"{k} {v['bytes'] / 2**20:.1f} MiB" for k, v in report["regions"].items())
        raise LlmbuildError(
            f"{recipe.path}: target.chip: {recipe.target.chip} has {limit / 2**30:.2f} GiB of device memory, "
            f"the model needs {total / 2**30:.2f} GiB ({parts})"
        )


def stop_ids(recipe: Recipe, bundle: TokenizerBundle, spec) -> list[int]:
    """The ids generation stops at: generation_config's EOS, and for a vision family also the terminators
    its published `chat()` stops at (its `family.CHAT_TERMINATORS`: MiniCPM-V's)."""
    ids = list(bundle.eos_token_ids or spec.eos_token_ids)
    own = family_part(recipe.vision.family, "family") if recipe.vision is not None else None
    if own is not None:
        known = token_ids_by_string(bundle.tokenizer_json)
        ids += [known[t] for t in own.CHAT_TERMINATORS if t in known and known[t] not in ids]
    return ids


def link(recipe: Recipe) -> None:
    paths = BuildPaths.of(recipe)
    spec = read_spec(paths.spec)
    shapes = shapes_of(recipe)
    plan = MemoryPlan.read(paths.plan)
    chip = load_chip(recipe.target.chip)
    objects = [Container(paths.head_object)] + [
        Container(paths.layer_object(i)) for i in range(spec.num_layers)
    ]
    # Headers only: at seq 8192 a 1.5B model's programs decode to about a gigabyte of Python objects, so
    # each is decoded once, to be timed, and dropped (perf_report below).
    nets = []
    activation = 0
    for obj in objects:
        for name in obj.names():
            if name.startswith("net:"):
                net, stage, layer, act = decode_header(obj.section(name))
                activation = max(activation, act)
                nets.append((layer, name, net, stage, obj))
    order = {"embedding": 0, "embedding_cache": 1, "lm_head": 3}
    stage_order = {"prefill": 0, "prefill_kv": 1, "decode": 2}
    nets.sort(key=lambda n: (order.get(n[2], 2), n[0], stage_order.get(n[3], 0)))
    device_bytes = recipe.target.device_memory_bytes or chip.device_memory_bytes
    report = memory_report(plan, activation, device_bytes)
    vision = _vision_parts(recipe, paths) if recipe.vision is not None else None
    if vision is not None:
        # The vit net's own address space (codegen/vision_plan.py) sits beside the language model's.
        report["vision"] = vision.report
        report["total_bytes"] += vision.report["total_bytes"]
    check_fits(recipe, report)

    bundle = read_tokenizer_bundle(tokenizer_dir(recipe, paths))
    meta = {
        "format": "llmbuild",
        "llmbuild_version": __version__,
        "recipe": recipe.name,
        "spec": spec_to_json(spec),
        "mode": recipe.quantization.mode,
        "chip": recipe.target.chip,
        "seq_length": shapes.seq_length,
        "prefill_length": shapes.prefill_length,
        "nets": [{"name": net, "stage": stage, "layer": layer, "section": name} for layer, name, net, stage, _ in nets],
        "memory": report,
        "bos_token_id": bundle.bos_token_id,
        "eos_token_ids": stop_ids(recipe, bundle, spec),
        "chat_template": bundle.chat_template,
        # The strings chat templates see as bos_token, eos_token, ... (transformers' special_tokens_map).
        "special_tokens": {
            k: v for k in ("bos_token", "eos_token", "unk_token", "pad_token") if (v := getattr(bundle, k)) is not None
        },
    }
    if vision is not None:
        meta["vision"] = vision.meta
    sections = [
        ("meta", [json.dumps(meta, indent=1, sort_keys=True).encode()]),
        ("plan", [plan.to_json().encode()]),
        ("tokenizer", [bundle.tokenizer_json.encode()]),
        ("weights", _weight_image([paths.head_weights] + [paths.layer_weights(i) for i in range(spec.num_layers)],
                                  plan)),
    ]
    sections += [(name, [bytes(obj.section(name))]) for _, name, _, _, obj in nets]
    if vision is not None:
        sections += vision.sections
    # The compiled groups timed on the chip's rates, next to the spec model's figures (docs/performance.md);
    # in the same pass, every layer's command stream found among the device-checked layers'. Both before
    # the binary is written: a failure leaves none.
    streams = StreamCoverage(plan, faithful_layers(spec.num_layers))
    perf = perf_report(meta, (streams.seen(decode(obj.section(name))) for _, name, _, _, obj in nets))
    streams.check(recipe)
    write_container(paths.binary(recipe.name), sections)
    write_json(paths.root / "memory.json", report)
    if vision is not None:
        from llmbuild.cost.compiled import time_vision

        timed = time_vision(meta, vision.program)
        perf["vision_encode_s"] = timed["vision_encode_s"]
        perf["first_token_latency_with_image_s"] = timed["vision_encode_s"] + perf["first_token_latency_s"]
    write_json(paths.root / "perf.json", perf)
    print(
        f"{recipe.name}: {paths.binary(recipe.name)} — device memory {report['total_bytes'] / 2**20:.1f} MiB "
        f"of {device_bytes / 2**30:.1f} GiB on {chip.name}; first token {perf['first_token_latency_s'] * 1e3:.2f} ms, "
        f"decode {perf['decode_tokens_per_s']:.1f} tokens/s (modelled from the compiled groups)"
    )


class StreamCoverage:
    """The build's checks run the command stream on the simulated device for the sampled layers only
    (verify/layer_check_policy.py); the rest run on the host path. Every other layer's stream must then be
    a sampled layer's apart from its base addresses (binary/layer_streams.py), or part of the binary would
    run on the chip without ever having run anywhere."""

    def __init__(self, plan: MemoryPlan, checked: set[int]):
        self.slots = SlotNames(plan)
        self.checked = checked
        self.keys: dict[str, dict[int, str]] = {}  # stage -> layer -> stream key

    def seen(self, prog: Program) -> Program:
        if prog.layer >= 0:
            self.keys.setdefault(prog.stage, {})[prog.layer] = stream_key(prog, self.slots)
        return prog

    def check(self, recipe: Recipe) -> None:
        for stage, keys in self.keys.items():
            ran = {keys[i] for i in self.checked if i in keys}
            unchecked = sorted(i for i, k in keys.items() if k not in ran)
            if unchecked:
                raise LlmbuildError(
                    f"{recipe.name}: layer {unchecked[0]}'s {stage} command stream differs from every "
                    f"device-checked layer's ({', '.join(map(str, sorted(self.checked)))}) beyond its base "
                    f"addresses: it would run on the chip unchecked" + (
                        f" (and {len(unchecked) - 1} more layers)" if len(unchecked) > 1 else ""))


@dataclass
class _VisionParts:
    meta: dict
    report: dict
    sections: list
    program: Any


def _vision_parts(recipe: Recipe, paths: BuildPaths) -> _VisionParts:
    """The vit net's program, plan and weight image, and what the runtime needs to feed it an image."""
    from llmbuild.artifacts.paths import VIT_NET, vision_dir, vlm_dir

    out = vision_dir(paths)
    plan = MemoryPlan.read(out / "plan.json")
    obj = Container(out / "vision.llmo")
    section = f"net:{VIT_NET}"
    _, _, _, activation = decode_header(obj.section(section))
    program = decode(obj.section(section))
    shapes = {name: program.tensors[t].shape for name, t in [*program.inputs, *program.outputs]}
    inputs = {name: shape for name, shape in shapes.items() if name != "image_features"}
    # The family's own tokens, tiling or slicing and normalization (its folder's `family.runtime_meta`), from
    # config.json as the family reads it where it has a reader (with what it keeps beside it: MiniCPM-V 4.6's
    # image processor settings).
    own = family_part(recipe.vision.family, "family")
    reader = getattr(own, "read_config", None)
    config = vlm_dir(recipe, paths) / "config.json"
    vlm = reader(config.parent) if reader else json.loads(config.read_text(encoding="utf-8"))
    tokenizer = tokenizer_dir(recipe, paths) / "tokenizer.json"
    vocab = json.loads(tokenizer.read_text(encoding="utf-8"))
    added = {t["content"]: t["id"] for t in vocab.get("added_tokens", [])}
    meta = {"family": recipe.vision.family, "net": VIT_NET, "section": section,
            "tokens_per_image": int(shapes["image_features"][1]),
            "inputs": {name: list(shape) for name, shape in inputs.items()},
            **own.runtime_meta(vlm, added, tokenizer, inputs, recipe.vision)}
    report = memory_report(plan, activation, 0)
    sections = [("vision_plan", [plan.to_json().encode()]),
                ("vision_weights", _weight_image([out / "weights.safetensors"], plan)),
                (section, [bytes(obj.section(section))])]
    return _VisionParts(meta, {k: v for k, v in report.items() if k != "device_bytes"}, sections, program)

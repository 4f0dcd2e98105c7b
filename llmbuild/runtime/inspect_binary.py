"""`llmbuild inspect RECIPE_OR_BINARY [--json]`: what a binary holds, how it uses device memory, its layer
groups and local memory per group, the compiled groups timed on the chip (`cost/compiled.py`: per group
DMA bytes, compute and estimated seconds, per net latency, per step times) and the spec model's
estimates."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from llmbuild import LlmbuildError, one_line
from llmbuild.binary import program as programs
from llmbuild.binary.container import Container
from llmbuild.binary.memory_map import MemoryPlan
from llmbuild.binary.validate import validate_program
from llmbuild.chips import load_chip
from llmbuild.numerics.formats import STORAGE, itemsize
from llmbuild.runtime.compiled_model import BINARY_FAULTS, read_meta


def inspect_binary(path: Path) -> dict:
    """What `llmbuild inspect` prints; a binary it cannot describe is one LlmbuildError naming the file."""
    try:
        return _inspect(path)
    except BINARY_FAULTS as exc:  # UnicodeDecodeError is a ValueError
        raise LlmbuildError(f"{path}: not a binary this llmbuild can describe "
                            f"({type(exc).__name__}: {one_line(str(exc))})") from None


def _program(c: Container, section: str, memory_bytes: int) -> programs.Program:
    try:
        prog = programs.decode(c.section(section))
        validate_program(prog, memory_bytes)
    except LlmbuildError as exc:
        raise LlmbuildError(f"{c.path}: section {section}: {exc}") from None
    return prog


def _inspect(path: Path) -> dict:
    with Container(path) as c:
        meta = read_meta(c)
        plan = MemoryPlan.from_json(bytes(c.section("plan")).decode())
        nets = []
        progs = [_program(c, n["section"], meta["memory"]["total_bytes"]) for n in meta["nets"]]
        timed = _timed(meta, progs)
        for i, prog in enumerate(progs):
            net_time = timed["nets"][i] if timed else None
            ops = Counter(i.op for i in prog.instrs)
            nets.append({
                "name": prog.net, "stage": prog.stage, "layer": prog.layer,
                "instructions": len(prog.instrs), "ops": dict(sorted(ops.items())),
                "activation_bytes": prog.activation_bytes,
                "weight_bytes": sum(
                    plan.weights[w].nbytes for w in _weights_read(prog, plan)
                ),
                "lmem_bytes": prog.lmem_bytes,
                "lmem_peak_bytes": max((g.lmem_peak_bytes for g in prog.groups), default=0),
                "latency_s": net_time["latency_s"] if net_time else None,
                "groups": [_group(prog, g, net_time["groups"][j] if net_time else None)
                           for j, g in enumerate(prog.groups)],
            })
        vision = _vision(c, meta) if isinstance(meta.get("vision"), dict) else None
        if vision is not None:
            nets.append(vision)
        sections = {name: e.size for name, e in c.entries.items()}
    chip = load_chip(meta["chip"])
    weight_bytes = sum(s.nbytes for s in plan.weights.values())
    by_dtype = Counter()
    for s in plan.weights.values():
        by_dtype[s.dtype] += s.nbytes // itemsize(s.dtype)
    return {
        "binary": str(path),
        "file_bytes": path.stat().st_size,
        "recipe": meta["recipe"],
        "mode": meta["mode"],
        "chip": meta["chip"],
        "seq_length": meta["seq_length"],
        "prefill_length": meta["prefill_length"],
        "memory": meta["memory"],
        "lmem_bytes": chip.lmem_bytes,
        "lmem_peak_bytes": max((n["lmem_peak_bytes"] for n in nets), default=0),
        "groups": sum(len(n["groups"]) for n in nets),
        "estimate": _estimates(meta),
        "timed": {k: v for k, v in timed.items() if k != "nets"} if timed else {"error": "see stderr"},
        "weight_bytes": weight_bytes,
        "weight_elements_by_dtype": dict(by_dtype),
        "nets": nets,
        "sections": sections,
    }


def _vision(c: Container, meta: dict) -> dict:
    """The vit net's row: its program in its own plan (vision_plan), timed like the language nets."""
    plan = MemoryPlan.from_json(bytes(c.section("vision_plan")).decode())
    prog = _program(c, meta["vision"]["section"], int(meta["memory"]["vision"]["total_bytes"]))
    timed: dict | None
    try:
        from llmbuild.cost.compiled import time_vision

        timed = time_vision(meta, prog)["net"]
    except Exception as exc:  # noqa: BLE001 - a timing is a report, never a reason for inspect to fail
        print(f"inspect: the vit net could not be timed: {type(exc).__name__}: {exc}", file=sys.stderr)
        timed = None
    return {
        "name": prog.net, "stage": prog.stage, "layer": prog.layer, "instructions": len(prog.instrs),
        "ops": dict(sorted(Counter(i.op for i in prog.instrs).items())),
        "activation_bytes": prog.activation_bytes,
        "weight_bytes": sum(s.nbytes for s in plan.weights.values()),
        "lmem_bytes": prog.lmem_bytes,
        "lmem_peak_bytes": max((g.lmem_peak_bytes for g in prog.groups), default=0),
        "latency_s": timed["latency_s"] if timed else None,
        "groups": [_group(prog, g, timed["groups"][j] if timed else None) for j, g in enumerate(prog.groups)],
    }


def _tensor_bytes(prog: programs.Program, t: int) -> int:
    desc = prog.tensors[t]
    n = STORAGE[desc.dtype][0]
    for d in desc.shape:
        n *= d
    return n


def _group(prog: programs.Program, g: programs.Group, timed: dict | None) -> dict:
    loads = [c for c in g.cmds if c.op == "Load"]
    stores = [c for c in g.cmds if c.op == "Store"]
    compute = [c for c in g.cmds if c.op not in ("Load", "Store")]
    return {
        "index": g.index,
        "ops": len({c.loc for c in compute}),
        "compute_commands": len(compute),
        "loads": len(loads),
        "stores": len(stores),
        "load_bytes": sum(_tensor_bytes(prog, c.result) for c in loads),
        "store_bytes": sum(_tensor_bytes(prog, c.operands[0]) for c in stores),
        "tile_rows": g.tile_rows,
        "row_tiles": -(-g.rows // g.tile_rows) if g.tile_rows else 1,
        "lmem_peak_bytes": g.lmem_peak_bytes,
        "first_op": compute[0].loc if compute else "",
        "last_op": compute[-1].loc if compute else "",
        "estimated_seconds": timed["estimated_seconds"] if timed else None,
        "dma_bytes": timed["dma_bytes"] if timed else None,
        "dma_seconds": timed["dma_s"] if timed else None,
        "compute_seconds": timed["compute_s"] if timed else None,
    }


def _timed(meta: dict, progs: list[programs.Program]) -> dict | None:
    """The compiled groups timed (cost/compiled.py); None, with a note, if the binary cannot be timed."""
    from llmbuild.cost.compiled import time_compiled

    try:
        return time_compiled(meta, progs)
    except Exception as exc:  # a timing is a report, never a reason for inspect to fail
        print(f"inspect: the compiled groups could not be timed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def _estimates(meta: dict) -> dict:
    """The cost model's figures for this binary, under both schedules (docs/design.md, "The cost model")."""
    from llmbuild.cost.chip_estimate import estimate_from_meta

    try:
        return {s: estimate_from_meta(meta, schedule=s).headline() for s in ("incumbent", "llmbuild")}
    except Exception as exc:  # an estimate is a report, never a reason for inspect to fail
        return {"error": f"{type(exc).__name__}: {exc}"}


def _weights_read(prog: programs.Program, plan: MemoryPlan) -> set[str]:
    by_address = {s.address: name for name, s in plan.weights.items()}
    used = {i for ins in prog.instrs for i in ins.operands}
    return {by_address[prog.tensors[t].address] for t in used if prog.tensors[t].address in by_address}


def format_report(r: dict) -> str:
    mib = 2**20
    lines = [
        f"{r['binary']}: recipe {r['recipe']}, mode {r['mode']}, chip {r['chip']}, "
        f"S={r['seq_length']}, L={r['prefill_length']}, {r['file_bytes'] / mib:.1f} MiB",
        f"device memory: {r['memory']['total_bytes'] / mib:.1f} MiB of {r['memory']['device_bytes'] / mib:.0f} MiB",
    ]
    for name, region in r["memory"]["regions"].items():
        lines.append(f"  {name:<11} base {region['base']:#012x}  {region['bytes'] / mib:10.2f} MiB")
    if "vision" in r["memory"]:
        v = r["memory"]["vision"]
        lines.append(f"  vision net  {v['total_bytes'] / mib:.2f} MiB in its own plan ("
                     + ", ".join(f"{k} {x['bytes'] / mib:.2f}" for k, x in v["regions"].items()) + " MiB)")
    lines.append(f"weights: {r['weight_bytes'] / mib:.1f} MiB, stored once ({r['weight_elements_by_dtype']})")
    lines.append(f"local memory: peak {r['lmem_peak_bytes'] / 1024:.0f} KiB of {r['lmem_bytes'] / 1024:.0f} KiB "
                 f"in {r['groups']} layer groups")
    for schedule, e in r["estimate"].items():
        if schedule != "error":
            lines.append(f"estimate ({schedule}): first token {e['first_token_latency_s'] * 1e3:.1f} ms, "
                         f"decode {e['decode_tokens_per_s']:.1f} tokens/s")
    t = r["timed"]
    if "steps" in t:
        lines.append(f"compiled groups timed: first token {t['first_token_latency_s'] * 1e3:.2f} ms, decode "
                     f"{t['decode_tokens_per_s']:.1f} tokens/s "
                     f"({t['decode_roofline_fraction']:.1%} of the DDR roofline)")
        for step, st in t["steps"].items():
            parts = ", ".join(f"{k} {v * 1e3:.3f}" for k, v in st["nets_s"].items())
            lines.append(f"  {step:<10} {st['latency_s'] * 1e3:8.3f} ms  (launch {st['launch_s'] * 1e3:.3f}, {parts})")
    lines.append(f"{'net':<18} {'stage':<11} {'instrs':>6} {'weights MiB':>11} {'activations KiB':>15} "
                 f"{'groups':>6} {'lmem peak KiB':>13} {'time ms':>8}")
    for n in r["nets"]:
        lines.append(f"{n['name']:<18} {n['stage']:<11} {n['instructions']:>6} {n['weight_bytes'] / mib:>11.2f} "
                     f"{n['activation_bytes'] / 1024:>15.1f} {len(n['groups']):>6} "
                     f"{n['lmem_peak_bytes'] / 1024:>13.0f} "
                     f"{(n['latency_s'] or 0) * 1e3:>8.3f}")
    return "\n".join(lines)

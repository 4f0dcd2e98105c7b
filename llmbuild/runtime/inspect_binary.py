"""`llmbuild inspect RECIPE_OR_BINARY [--json]`: what a binary holds and how it uses device memory."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from llmbuild.codegen import program as programs
from llmbuild.codegen.container import Container
from llmbuild.numerics.formats import itemsize
from llmbuild.passes.memory_plan import MemoryPlan


def inspect_binary(path: Path) -> dict:
    with Container(path) as c:
        meta = json.loads(bytes(c.section("meta")))
        plan = MemoryPlan.from_json(bytes(c.section("plan")).decode())
        nets = []
        for n in meta["nets"]:
            prog = programs.decode(c.section(n["section"]))
            ops = Counter(i.op for i in prog.instrs)
            nets.append({
                "name": prog.net, "stage": prog.stage, "layer": prog.layer,
                "instructions": len(prog.instrs), "ops": dict(sorted(ops.items())),
                "activation_bytes": prog.activation_bytes,
                "weight_bytes": sum(
                    plan.weights[w].nbytes for w in _weights_read(prog, plan)
                ),
            })
        sections = {name: e.size for name, e in c.entries.items()}
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
        "weight_bytes": weight_bytes,
        "weight_elements_by_dtype": dict(by_dtype),
        "nets": nets,
        "sections": sections,
    }


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
    lines.append(f"weights: {r['weight_bytes'] / mib:.1f} MiB, stored once ({r['weight_elements_by_dtype']})")
    lines.append(f"{'net':<18} {'stage':<11} {'instrs':>6} {'weights MiB':>11} {'activations KiB':>15}")
    for n in r["nets"]:
        lines.append(f"{n['name']:<18} {n['stage']:<11} {n['instructions']:>6} {n['weight_bytes'] / mib:>11.2f} "
                     f"{n['activation_bytes'] / 1024:>15.1f}")
    return "\n".join(lines)

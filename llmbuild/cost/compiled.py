"""The compiled binary's timing (`groups.py` over every net) per step, and `perf.json`.

    first token  = launch + embedding(L) + every layer's block_i + lm_head
    decode       = launch + embedding_cache + every layer's block_cache_i + lm_head (the static net
                   reads all S cache rows, so the position does not change it)
    roofline     = nominal DDR bandwidth / (weight + KV-cache bytes the decode nets load)

Next to them, the spec model's `estimate()` under both schedules and the relative difference
(group-timed / spec-modelled - 1), so a change to the layer-group pass shows up against the projection.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from llmbuild.binary import program as programs
from llmbuild.binary.container import Container
from llmbuild.chips import load_chip
from llmbuild.cost.efficiency import Efficiency, efficiency_for
from llmbuild.cost.group_timing import NetTime, time_programs
from llmbuild.cost.hardware import Rates

# llmbuild's code generator emits one command stream per net, which one core runs: the timing credits the
# compute of one core, whatever the chip has (the BM1688's second core idles until codegen splits work).
COMMAND_STREAMS = 1
HEAD_NETS = {"prefill": "embedding", "prefill_kv": "embedding", "decode": "embedding_cache"}
COMPARED = ("first_token_latency_s", "decode_tokens_per_s", "decode_roofline_fraction", "decode_bytes_per_token")


def step_nets(nets: list[NetTime], step: str) -> list[NetTime]:
    """The nets one `step` runs, in order: its embedding, each layer's block of that stage, the lm_head."""
    by_name = {n.name: n for n in nets}
    blocks = sorted((n for n in nets if n.stage == step), key=lambda n: n.layer)
    return [by_name[HEAD_NETS[step]], *blocks, by_name["lm_head"]]


def time_compiled(meta: dict[str, Any], progs: Iterable[programs.Program],
                  efficiency: Efficiency | None = None) -> dict[str, Any]:
    """Group-timed figures of a binary whose meta and decoded programs are given (in the meta's order; an
    iterator is consumed once, so the programs need not all be held)."""
    chip = load_chip(meta["chip"])
    rates = Rates(chip, streams=COMMAND_STREAMS)
    fitted, calibrated = efficiency_for(chip.name)
    eff = efficiency or fitted
    regions = {k: (v["base"], v["bytes"]) for k, v in meta["memory"]["regions"].items()}
    # Every net is timed alone (each starts on idle engines), so one pass serves all three steps.
    nets = [time_programs([p], rates, eff, regions)[0] for p in progs]
    steps = {}
    for step in ("prefill", "prefill_kv", "decode"):
        order = step_nets(nets, step)
        stage_s: dict[str, float] = {}
        for n in order:
            kind = n.name if n.stage not in HEAD_NETS else n.name.rsplit("_", 1)[0]
            stage_s[kind] = stage_s.get(kind, 0.0) + n.latency_s
        steps[step] = {"latency_s": eff.launch_s + sum(n.latency_s for n in order), "launch_s": eff.launch_s,
                       "nets_s": stage_s, "dma_bytes": sum(n.dma_bytes for n in order)}
    must_read = sum(n.region_bytes("weight", "kv") for n in step_nets(nets, "decode"))
    roofline = rates.ddr_bytes_per_s / must_read if must_read else float("inf")
    tokens_per_s = 1.0 / steps["decode"]["latency_s"]
    return {
        "chip": chip.name,
        "calibrated": calibrated and efficiency is None,
        "efficiency": eff.to_dict(),
        "first_token_latency_s": steps["prefill"]["latency_s"],
        "prefill_kv_latency_s": steps["prefill_kv"]["latency_s"],
        "decode_latency_s": steps["decode"]["latency_s"],
        "decode_tokens_per_s": tokens_per_s,
        "decode_bytes_per_token": must_read,
        "decode_roofline_tokens_per_s": roofline,
        "decode_roofline_fraction": tokens_per_s / roofline,
        "steps": steps,
        "nets": [n.to_dict() for n in nets],
    }


def read_binary(path: Path) -> tuple[dict[str, Any], list[programs.Program]]:
    with Container(path) as c:
        meta = json.loads(bytes(c.section("meta")))
        progs = [programs.decode(c.section(n["section"])) for n in meta["nets"]]
    return meta, progs


def perf_report(meta: dict[str, Any], progs: Iterable[programs.Program]) -> dict[str, Any]:
    """perf.json: the group-timed figures, the spec model's under both schedules, and their differences."""
    from llmbuild.cost.chip_estimate import estimate_from_meta

    timed = time_compiled(meta, progs)
    spec: dict[str, Any] = {}
    difference: dict[str, Any] = {}
    for schedule in ("incumbent", "llmbuild"):
        e = estimate_from_meta(meta, schedule=schedule)
        spec[schedule] = {**e.headline(), "decode_latency_s": e.decode_latency_s,
                          "stages": {s.name: s.step_latency_s for s in e.stages}}
        difference[schedule] = {k: timed[k] / spec[schedule][k] - 1.0 for k in COMPARED if spec[schedule][k]}
    return {
        # Nothing here was measured on a chip: the compiled groups are timed by the cost model.
        "modelled": "the compiled command streams timed by llmbuild's cost model (one core each), not measured "
                    "on a chip",
        "recipe": meta["recipe"], "mode": meta["mode"], "seq_length": meta["seq_length"],
        "prefill_length": meta["prefill_length"],
        "device_memory_bytes": meta["memory"]["total_bytes"],
        **timed,
        "spec_estimate": spec,
        "difference_vs_spec": difference,
    }


def time_vision(meta: dict[str, Any], prog: programs.Program, efficiency: Efficiency | None = None) -> dict[str, Any]:
    """The vit net's groups timed like a language net, in its own address space (meta.memory.vision): the
    encode time of one image, which comes before the prefill of a prompt that holds it."""
    chip = load_chip(meta["chip"])
    fitted, _ = efficiency_for(chip.name)
    eff = efficiency or fitted
    regions = {k: (v["base"], v["bytes"]) for k, v in meta["memory"]["vision"]["regions"].items()}
    net = time_programs([prog], Rates(chip, streams=COMMAND_STREAMS), eff, regions)[0]
    return {"vision_encode_s": eff.launch_s + net.latency_s, "net": net.to_dict()}

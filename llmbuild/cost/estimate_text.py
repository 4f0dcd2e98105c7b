"""Estimates as text: the report `llmbuild estimate` prints, and Markdown tables for the docs."""

from __future__ import annotations

from collections.abc import Sequence

from llmbuild.cost.chip_estimate import Estimate

GB = 1e9
MIB = 2**20


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def text_report(est: Estimate, title: str, others: Sequence[Estimate] = (), ops: bool = False) -> str:
    mem = est.memory
    calibrated = "calibrated" if est.calibrated else "not calibrated: bm1684x efficiencies"
    group = f" (group {est.group_size})" if est.mode.startswith("w") else ""
    roofline_bytes = est.decode_bytes_per_token
    lines = [
        f"{title}: {est.architecture}, {est.params / 1e9:.2f} B params, {est.mode}{group} on {est.chip} "
        f"({calibrated}), S {est.seq_length}, L {est.prefill_length}, schedule {est.schedule}",
        f"  first-token latency  {est.first_token_latency_s:.3f} s (a prompt of {est.prefill_length} tokens)",
        f"  decode               {est.decode_tokens_per_s:.2f} tokens/s ({est.decode_latency_s * 1e3:.2f} ms/token at "
        f"position {est.position}; the static decode reads all {est.seq_length} cache rows)",
        f"  DDR roofline         {est.decode_roofline_tokens_per_s:.2f} tokens/s ({roofline_bytes / GB:.3f} GB of "
        f"weights and KV per token): {est.decode_roofline_fraction:.1%} reached, "
        f"{est.decode_sustained_fraction:.1%} of the sustained {est.efficiency.ddr:.0%} DMA rate",
        f"  device memory        {mem.total_bytes / 2**30:.2f} GiB of {mem.limit_bytes / 2**30:.2f} GiB: "
        f"fits: {str(mem.fits).lower()} ("
        + ", ".join(f"{k} {v / 2**30:.2f}" for k, v in mem.regions.items()) + " GiB)",
    ]
    for o in others:
        lines.append(f"  schedule {o.schedule + ':':<11} FTL {o.first_token_latency_s:.3f} s, decode "
                     f"{o.decode_tokens_per_s:.2f} tokens/s, {o.decode_roofline_fraction:.1%} of its DDR roofline "
                     f"({o.decode_bytes_per_token / GB:.3f} GB/token)")
    lines += [
        "",
        f"  {'stage':<16}{'nets':>5}{'tokens':>8}{'DMA MiB':>11}{'GFLOP':>10}{'DMA ms':>10}{'compute ms':>12}"
        f"{'latency ms':>12}   (per net; latency as scheduled in its step)",
    ]
    for s in est.stages:
        lines.append(f"  {s.name:<16}{s.count:>5}{s.tokens:>8}{s.dma_bytes / MIB:>11.1f}{s.flops / 1e9:>10.2f}"
                     f"{s.dma_s * 1e3:>10.3f}{s.compute_s * 1e3:>12.3f}{s.latency_s * 1e3:>12.3f}")
        if ops:
            for o in s.ops:
                lines.append(f"    {o.name:<14}{'':>13}{o.dma_bytes / MIB:>11.2f}{o.flops / 1e9:>10.3f}"
                             f"{o.dma_s * 1e3:>10.4f}{o.compute_s * 1e3:>12.4f}   {o.compute_cycles:,.0f} cycles")
    return "\n".join(lines)

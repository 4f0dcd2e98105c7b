"""One recipe's results, read from what its build left (<build>/<recipe>/): binary and device memory,
time and memory per rule, verification margins, the chip estimates and the host's speed."""

from __future__ import annotations

from pathlib import Path

from llmbuild.zoo import benchmarks, similarity
from llmbuild.zoo.jsonio import read_json_if_any

# verify.json's worst cosines and the tolerance each is judged against (llmbuild/verify/verdict.py).
_MARGINS = {"tpu_vs_top": "tpu_cosine", "top_vs_source": "top_cosine"}


def collect(build_dir: Path, name: str) -> dict:
    """Everything the page shows for a recipe that built; a value is None where its file is absent."""
    folder = Path(build_dir) / name
    binary = folder / f"{name}.llmb"
    verify = read_json_if_any(folder / "verify.json") or {}
    e2e = read_json_if_any(folder / "e2e.json") or {}
    perf = read_json_if_any(folder / "perf.json") or {}
    memory = read_json_if_any(folder / "memory.json") or {}
    vision = read_json_if_any(folder / "vision" / "metrics.json")
    rules = benchmarks.read_rules(folder / "benchmarks")
    seconds = [r["seconds"] for r in rules.values() if r["seconds"] is not None]
    rss = [r["max_rss_mb"] for r in rules.values() if r["max_rss_mb"] is not None]
    return {
        "binary_bytes": binary.stat().st_size if binary.is_file() else None,
        "device_memory_bytes": memory.get("total_bytes", perf.get("device_memory_bytes")),
        "rules": rules,
        "build_seconds": round(sum(seconds), 3) if seconds else None,  # every rule once, one after another
        "peak_rss_mb": max(rss) if rss else None,
        "verify": _verify(verify),
        "margins": _margins(verify, vision),
        "nets": similarity.per_net(folder),
        "tokens": e2e.get("ids") if "image" not in e2e else [*e2e.get("ids", []), -1, *e2e["image"]["ids"]],
        "tokens_equal": e2e.get("tokens_equal") if "image" not in e2e else bool(
            e2e.get("tokens_equal") and e2e["image"]["tokens_equal"]),
        # A vision-language recipe's vit net against transformers (vision/metrics.json) and its run with an image.
        "vision": None if vision is None else {"cosine": vision.get("cosine_device"),
                                               "threshold": vision.get("threshold"),
                                               "image_tokens_equal": (e2e.get("image") or {}).get("tokens_equal")},
        "host_tokens_per_s": _host_speed(e2e),
        "chip": {key: perf.get(key) for key in ("first_token_latency_s", "decode_tokens_per_s",
                                                 "decode_roofline_fraction", "chip", "mode")},
    }


def _verify(report: dict) -> dict:
    e2e = report.get("end_to_end", {})
    return {
        "passed": report.get("passed"),
        "checks": report.get("checks"),
        "worst_cosine": report.get("worst_cosine", {}),
        "tolerances": report.get("tolerances", {}),
        "logits_cosine": _worst_logits(e2e),
        "tokens_equal": e2e.get("tokens_equal"),
        "failures": report.get("failures", []),
        # The quantized tensors read by an implementation llmbuild did not write (verify/independent_dequant.py).
        "independent_dequantization": report.get("independent_dequantization"),
    }


def _margins(report: dict, vision: dict | None = None) -> dict[str, float | None]:
    """How far each worst similarity sits above its tolerance (a drop is a regression even while it passes);
    with a vit net, its image features' cosine above `vision.image_cosine` too."""
    worst, tolerances = report.get("worst_cosine", {}), report.get("tolerances", {})
    margins = {}
    for key, tolerance in _MARGINS.items():
        margins[key] = _difference(worst.get(key), tolerances.get(tolerance))
    logits = _worst_logits(report.get("end_to_end", {}))
    margins["logits"] = _difference(logits, tolerances.get("logits_cosine"))
    if vision is not None:
        margins["vision"] = _difference(vision.get("cosine_device"), vision.get("threshold"))
    return margins


def _worst_logits(e2e: dict) -> float | None:
    """The worst step's logits cosine of the teacher-forced end-to-end run (older reports: the first's)."""
    return (e2e.get("worst_step_logits") or e2e.get("first_logits") or {}).get("cosine")


def _difference(value: float | None, tolerance: float | None) -> float | None:
    return None if value is None or tolerance is None else round(value - tolerance, 9)


def _host_speed(e2e: dict) -> float | None:
    """Generated tokens per second of the end-to-end run on the host path (prefill included)."""
    seconds, ids = e2e.get("host_seconds"), e2e.get("ids")
    return round(len(ids) / seconds, 2) if seconds and ids else None

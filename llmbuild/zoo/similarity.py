"""How close each compiled net came to its reference, per layer and stage, from the checks' metrics
(<build>/<recipe>/layers/<i>/metrics.json and head/metrics.json, written by `llmbuild check`)."""

from __future__ import annotations

from pathlib import Path

from llmbuild.zoo.jsonio import read_json


def per_net(recipe_dir: Path) -> list[dict]:
    """One entry per layer (in order, then the head) and stage: the worst output cosine of the device
    against the TopOp interpretation (`tpu_vs_top`) and of TopOp against transformers (`top_vs_source`),
    and the op where the device was furthest from TopOp."""
    files = sorted(Path(recipe_dir).glob("layers/*/metrics.json"), key=lambda p: int(p.parent.name))
    head = Path(recipe_dir) / "head" / "metrics.json"
    rows = []
    for path in [*files, *([head] if head.is_file() else [])]:
        metrics = read_json(path)
        for stage, values in sorted(metrics.get("stages", {}).items()):
            tpu = values.get("tpu_vs_top", {})
            ops = tpu.get("ops") or []
            worst_op = min(ops, key=lambda op: op[1]) if ops else None
            rows.append({
                "layer": metrics.get("layer"),
                "stage": stage,
                "executor": values.get("executor"),
                "tpu_vs_top": _worst(tpu.get("outputs", {})),
                "top_vs_source": _worst(values.get("top_vs_source", {})),
                "worst_op": worst_op[0] if worst_op else None,
                "worst_op_cosine": worst_op[1] if worst_op else None,
            })
    return rows


def _worst(outputs: dict) -> float | None:
    cosines = [v["cosine"] for v in outputs.values() if isinstance(v, dict) and "cosine" in v]
    return min(cosines) if cosines else None

"""A vision tower written to ONNX by torch.onnx, the one way every vision family exports its `vit` net's source.

torch's constant folding is off: with it, the legacy exporter writes each projection's transposed weight as a
new constant (a float32 copy of every weight, 1.8 GB more for SigLIP-400M at export), where without it the
graph keeps `Transpose(weight)` nodes over the module's own tensors. Folding is the reader's job
(frontend/onnx_model.py evaluates a node of constants as a view where it can: a transpose copies nothing),
so the net imported is the same either way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError

EXPORTERS = ("legacy", "dynamo")  # TorchScript tracing at opset 17; torch.export at opset 18


def export_tower_onnx(module: Any, args: tuple, out: Path, input_names: list[str], exporter: str) -> Path:
    """Write `module` traced on `args` to `out` with the named inputs and one output, `image_features`."""
    import torch

    if exporter not in EXPORTERS:
        raise LlmbuildError(f"vision.exporter: {exporter!r} is not one of {', '.join(EXPORTERS)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(module, args, str(out), input_names=input_names, output_names=["image_features"],
                          opset_version=18 if exporter == "dynamo" else 17, dynamo=exporter == "dynamo",
                          do_constant_folding=False)
    return out


__all__ = ["EXPORTERS", "export_tower_onnx"]

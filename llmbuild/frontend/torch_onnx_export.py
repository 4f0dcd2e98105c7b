"""A vision tower written to ONNX by torch.onnx, the one way every vision family exports its `vit` net's source
(and the exporters a recipe's `vision.exporter` may name).

torch's constant folding is off: with it, the legacy exporter writes each projection's weight transposed, a new
tensor the importer must copy back to the [N, K] layout it stores; without it the graph keeps `Transpose(weight)`
over the module's own tensors, which frontend/onnx_model.py evaluates as a view and the importer takes without a
copy. The net imported is the same either way (tests/test_minicpmv4_6.py). The export's own peak is not this:
the legacy exporter runs the tower at the net's size, torch.export traces it on fake tensors."""

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

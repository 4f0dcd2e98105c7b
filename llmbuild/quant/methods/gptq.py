"""GPTQ through gptqmodel (7.6): GPTQ v1 checkpoints (qweight/qzeros/scales/g_idx), act order optional.

CPU settings, measured on 2 cores (tests/fixtures/quant/README.md): `offload_to_disk=False` (the default
offload spent 90 of 98 s finalizing a tiny model), `GPTQMODEL_CPU_WORKERS` = our thread count (read at
import). The model is loaded in float32 so the unquantized tensors (embeddings, norms) keep the float
checkpoint's values instead of gptqmodel's CPU default of bf16.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError
from llmbuild.quant.methods._runtime import Option, QuantParams

BITS = (4, 8)  # what llmbuild's GPTQ reader unpacks (gptqmodel also writes 2 and 3)
OPTIONS: dict[str, Option] = {
    "damp_percent": Option(0.05, float),  # gptqmodel's default Hessian dampening
    "batch_size": Option(1, int),
    "checkpoint_format": Option("gptq", str, ("gptq", "gptq_v2")),  # v2: zero points without the -1
    "dtype": Option("float32", str, ("float32", "bfloat16", "float16")),  # the model while quantizing
}


def check(params: QuantParams, options: dict[str, Any]) -> None:
    if not 0 < options["damp_percent"] < 1:
        raise LlmbuildError(f"gptq: options.damp_percent must be in (0, 1), got {options['damp_percent']}")
    if options["batch_size"] <= 0:
        raise LlmbuildError(f"gptq: options.batch_size must be a positive integer, got {options['batch_size']}")


def environment(params: QuantParams) -> dict[str, str]:
    return {"GPTQMODEL_CPU_WORKERS": str(params.threads)}


def run(float_dir: Path, work: Path, params: QuantParams, calibration: list[list[int]], options: dict) -> None:
    import torch
    from gptqmodel import GPTQModel, QuantizeConfig
    from gptqmodel.looper import loop_processor
    from gptqmodel.quantization import FORMAT

    config = QuantizeConfig(
        bits=params.bits,
        group_size=params.group_size,
        sym=params.sym,
        desc_act=params.desc_act,
        damp_percent=options["damp_percent"],
        offload_to_disk=False,
        format=FORMAT.GPTQ_V2 if options["checkpoint_format"] == "gptq_v2" else FORMAT.GPTQ,
    )
    data = [{"input_ids": ids, "attention_mask": [1] * len(ids)} for ids in calibration]
    dtype = getattr(torch, options["dtype"])
    log_dir = loop_processor._PROJECT_LOG_DIR
    loop_processor._PROJECT_LOG_DIR = work / "logs"
    try:
        model = GPTQModel.load(str(float_dir), config, device="cpu", dtype=dtype, trust_remote_code=False)
        model.quantize(data, batch_size=options["batch_size"])
        model.save(str(work / "out"))
    finally:
        loop_processor._PROJECT_LOG_DIR = log_dir

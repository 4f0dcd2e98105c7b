"""AutoRound through auto-round (0.16): signed-gradient tuning of rounding and min/max per block.

Output formats: `auto_round` (quant_method "auto-round"; auto-round packs asymmetric models in the AWQ
layout, symmetric ones in the GPTQ layout) or `auto_gptq` (quant_method "gptq", provider auto-round).
One format per run: several at once fails for sym=False in 0.16.1 (tests/fixtures/quant/README.md).

CPU settings: `dataset=` is always our token ids (the default is a hub download), torch.compile off
(faster on CPU and one less source of variation), device_map "cpu".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError
from llmbuild.quant.methods._runtime import Option, QuantParams

BITS = (4, 8)
OPTIONS: dict[str, Option] = {
    "iters": Option(200, int),  # auto-round's default tuning steps per block; 0 = its RTN path
    "batch_size": Option(8, int),  # auto-round caps it at the number of samples
    "lr": Option(None, float),  # None: auto-round's default (1 / iters)
    "format": Option("auto_round", str, ("auto_round", "auto_gptq")),
    "dtype": Option("float32", str, ("float32", "bfloat16", "float16")),  # the model while tuning
}


def check(params: QuantParams, options: dict[str, Any]) -> None:
    if params.desc_act:
        raise LlmbuildError("autoround: desc_act must be false: AutoRound keeps rows in order (no g_idx)")
    if options["iters"] < 0:
        raise LlmbuildError(f"autoround: options.iters must be >= 0, got {options['iters']}")
    if options["batch_size"] <= 0:
        raise LlmbuildError(f"autoround: options.batch_size must be a positive integer, got {options['batch_size']}")
    if params.bits == 8 and not params.sym and options["format"] == "auto_round":
        # auto-round packs asymmetric auto_round checkpoints in the AWQ layout, which holds 4-bit values only.
        raise LlmbuildError("autoround: bits 8 with sym false needs options.format auto_gptq")


def environment(params: QuantParams) -> dict[str, str]:
    return {}


def run(float_dir: Path, work: Path, params: QuantParams, calibration: list[list[int]], options: dict) -> None:
    import torch
    from auto_round import AutoRound
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        str(float_dir), dtype=getattr(torch, options["dtype"]), trust_remote_code=False
    )
    tokenizer = AutoTokenizer.from_pretrained(str(float_dir), trust_remote_code=False)
    extra = {} if options["lr"] is None else {"lr": options["lr"]}
    rounder = AutoRound(
        model,
        tokenizer,
        bits=params.bits,
        group_size=params.group_size,
        sym=params.sym,
        dataset=[torch.tensor([ids]) for ids in calibration],
        nsamples=len(calibration),
        seqlen=len(calibration[0]),
        iters=options["iters"],
        batch_size=options["batch_size"],
        enable_torch_compile=False,
        seed=params.seed,
        device_map="cpu",
        **extra,
    )
    rounder.quantize_and_save(str(work / "out"), format=options["format"])

"""AWQ through autoawq (0.2.9, installed with --no-deps: it quantizes on CPU without triton).

AutoAWQ is deprecated upstream but still the reference implementation of the AWQ scale and clip search,
and its GEMM checkpoints are what transformers, vLLM and gptqmodel load as "awq"; it runs here on CPU with
transformers 5, so we use it rather than reimplementing the search. What it needs from us:
- token ids as calibration data (text samples longer than max_calib_seq_len are silently dropped); it
  concatenates the samples and re-cuts them into blocks of max_calib_seq_len, so equal windows of that
  length reach it unchanged;
- `trust_remote_code=False` (its from_pretrained defaults to True);
- asymmetric quantization: the GEMM format has no symmetric variant (zero points are required);
- two fixes to its quantizer class (`_fixed_quantizer`, passed as quantizer_cls):
  * its scale search snapshots the block with `{k: v.cpu() for k, v in state_dict().items()}` and restores
    that snapshot after trying each candidate scale. On a GPU `.cpu()` copies; on the CPU it returns the
    same tensors, which the search then scales in place, so every "restore" reloads weights already
    multiplied by the first candidate's scales: the search compares the wrong weights and the saved model
    is no longer equivalent to the float one (its q/k/v/gate/up columns carry an extra scale of 0.8-1.25
    that no norm undoes; tests/test_quant_methods.py catches it). We hand it a state_dict of copies.
  * its clip search handles output rows in batches of 64 or 256 and asserts out_features % 64 == 0, which
    e.g. a k/v projection 32 wide fails; we pad the rows with zeros for that search only (rows are
    searched independently, so the real rows' results are unchanged).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError
from llmbuild.quant.methods._runtime import Option, QuantParams

BITS = (4,)  # the GEMM format packs 4-bit values only
OPTIONS: dict[str, Option] = {
    "apply_clip": Option(True, bool),  # the clip (max-shrink) search after the scale search
    "duo_scaling": Option(True, bool),  # scales from activations and weights (AutoAWQ's default)
}
_CLIP_ROWS = 64  # AutoAWQ's smallest output-row batch in _compute_best_clip


def check(params: QuantParams, options: dict[str, Any]) -> None:
    if params.sym:
        raise LlmbuildError("awq: sym must be false: autoawq's GEMM format always stores zero points")
    if params.desc_act:
        raise LlmbuildError("awq: desc_act must be false: AWQ has no act-order variant")
    if params.group_size == -1:
        raise LlmbuildError("awq: group_size -1 (per channel) is not supported by autoawq's GEMM format")


def environment(params: QuantParams) -> dict[str, str]:
    return {}


def run(float_dir: Path, work: Path, params: QuantParams, calibration: list[list[int]], options: dict) -> None:
    import torch
    from awq import AutoAWQForCausalLM
    from awq.quantize.quantizer import AwqQuantizer
    from transformers import AutoTokenizer

    model = AutoAWQForCausalLM.from_pretrained(
        str(float_dir), torch_dtype=torch.float32, device_map="cpu", trust_remote_code=False, safetensors=True
    )
    tokenizer = AutoTokenizer.from_pretrained(str(float_dir), trust_remote_code=False)
    model.quantize(
        tokenizer,
        quant_config={"zero_point": True, "q_group_size": params.group_size, "w_bit": params.bits, "version": "GEMM"},
        calib_data=calibration,
        max_calib_samples=len(calibration),
        max_calib_seq_len=len(calibration[0]),
        apply_clip=options["apply_clip"],
        duo_scaling=options["duo_scaling"],
        quantizer_cls=_fixed_quantizer(AwqQuantizer),
    )
    model.save_quantized(str(work / "out"))


def _fixed_quantizer(base: type) -> type:
    import torch

    class FixedAwqQuantizer(base):  # type: ignore[misc, valid-type]
        def _compute_best_scale(self, x: Any, w_mean: Any, x_mean: Any, module2inspect: Any, *args: Any, **kwargs: Any):
            state_dict = module2inspect.state_dict
            # An instance attribute shadows the method for this call only: the snapshot is real copies.
            module2inspect.state_dict = lambda: {k: v.detach().clone() for k, v in state_dict().items()}
            try:
                return super()._compute_best_scale(x, w_mean, x_mean, module2inspect, *args, **kwargs)
            finally:
                del module2inspect.state_dict

        def _compute_best_clip(self, w: torch.Tensor, input_feat: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            rows = w.shape[0]
            pad = -rows % _CLIP_ROWS
            if pad:
                w = torch.cat([w, w.new_zeros(pad, w.shape[1])])
            return super()._compute_best_clip(w, input_feat, **kwargs)[:rows]

    return FixedAwqQuantizer

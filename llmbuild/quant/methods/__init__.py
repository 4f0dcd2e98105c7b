"""Quantization methods that run in the build through the real libraries: GPTQ (gptqmodel), AWQ (autoawq)
and AutoRound (auto-round). Round-to-nearest needs no library and no checkpoint: the layer job does it
(`llmbuild/quant/rtn.py`).

    quantize_checkpoint(method, float_dir, out_dir, bits=, group_size=, sym=, desc_act=,
                        calibration_ids=, seed=0, options=None) -> report (JSON-able dict)
    calibration_ids(text_file, tokenizer_dir, samples, seq_length) -> list[list[int]]

The result is a Hugging Face quantized checkpoint directory that `llmbuild.quant.QuantizedCheckpoint`
reads: config.json with the library's quantization_config, one model.safetensors, the float
checkpoint's tokenizer files. It is written atomically and is byte-identical for the same inputs (same
seed and `threads`). Each library is imported only when its method runs; a missing one is a one-line
LlmbuildError naming the package and ./scripts/install.sh.
"""

from __future__ import annotations

import importlib
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError
from llmbuild.quant.methods._runtime import Option, QuantParams
from llmbuild.quant.methods.calibration import calibration_digest, calibration_ids

__all__ = ["METHODS", "Method", "QuantParams", "calibration_ids", "quantize_checkpoint"]

# torch's intra-op threads while a library runs. Fixed rather than "all cores" because float sums depend
# on how work is split, and a checkpoint should not depend on the machine that built it; raise it with
# options={"threads": n} for big models (it is then part of the step's parameters like any option).
DEFAULT_THREADS = 2
COMMON_OPTIONS: dict[str, Option] = {"threads": Option(DEFAULT_THREADS, int)}


@dataclass(frozen=True)
class Method:
    name: str
    module: str  # the llmbuild module that drives the library
    import_name: str  # what `import` needs
    distribution: str  # the installed distribution (its version goes into the report)
    install: str  # the pip command that installs it, for the missing-library error


METHODS: dict[str, Method] = {
    "autoround": Method("autoround", "llmbuild.quant.methods.autoround", "auto_round", "auto-round",
                        "pip install auto-round==0.16.1"),
    "awq": Method("awq", "llmbuild.quant.methods.awq", "awq", "autoawq", "pip install --no-deps autoawq==0.2.9"),
    "gptq": Method("gptq", "llmbuild.quant.methods.gptq", "gptqmodel", "gptqmodel", "pip install gptqmodel==7.6.0"),
}  # fmt: skip


def quantize_checkpoint(
    method: str,
    float_dir: Path,
    out_dir: Path,
    *,
    bits: int,
    group_size: int,
    sym: bool,
    desc_act: bool,
    calibration_ids: list[list[int]],
    seed: int = 0,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Quantize the float HF checkpoint `float_dir` with `method` into `out_dir` (all or nothing).

    Returns {method, library, library_version, torch_version, seconds, params, calibration_sha256,
    quantization_config, files}."""
    from llmbuild.frontend.atomic import atomic_directory
    from llmbuild.frontend.config_spec import spec_from_hf_config_file
    from llmbuild.quant.methods._output import finish_checkpoint, library_output
    from llmbuild.quant.methods._runtime import (
        import_library,
        library_version,
        reproducible_torch,
        stdout_to_stderr,
    )

    entry = METHODS.get(method)
    if entry is None:
        raise LlmbuildError(f"quantization method {method!r} is not known; expected one of {', '.join(METHODS)}")
    driver = importlib.import_module(entry.module)
    float_dir, out_dir = Path(float_dir), Path(out_dir)
    spec = spec_from_hf_config_file(float_dir / "config.json")
    opts = _resolve_options(method, {**COMMON_OPTIONS, **driver.OPTIONS}, options or {})
    params = QuantParams(bits, group_size, sym, desc_act, _int("seed", seed, method), opts.pop("threads"))
    if params.threads <= 0:
        raise LlmbuildError(f"{method}: options.threads must be a positive integer, got {params.threads}")
    _check_params(method, params, driver.BITS, spec)
    driver.check(params, opts)
    samples = _check_calibration(method, calibration_ids, spec.vocab_size)

    start = time.perf_counter()
    with stdout_to_stderr():
        for key, value in driver.environment(params).items():
            os.environ.setdefault(key, value)  # read by the library at import; a user's setting wins
        import_library(method, entry.import_name, entry.install)
        import torch

        out_dir.parent.mkdir(parents=True, exist_ok=True)
        # The library saves beside the destination (same file system, no /tmp size limit), then the
        # finished directory replaces out_dir in one rename.
        with tempfile.TemporaryDirectory(prefix=f".{out_dir.name}.", suffix=".work", dir=out_dir.parent) as work:
            try:
                with reproducible_torch(params.seed, params.threads):
                    driver.run(float_dir, Path(work), params, samples, opts)
            except Exception as exc:  # the library's own failure: one line here, the traceback in __cause__
                reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
                raise LlmbuildError(f"{method}: {entry.distribution} failed on {float_dir}: {reason}") from exc
            with atomic_directory(out_dir) as tmp:
                qc = finish_checkpoint(library_output(Path(work)), float_dir, tmp)
    return {
        "method": method,
        "library": entry.distribution,
        "library_version": library_version(entry.distribution),
        "torch_version": torch.__version__,
        "seconds": round(time.perf_counter() - start, 3),
        "params": {
            "bits": bits,
            "group_size": group_size,
            "sym": sym,
            "desc_act": desc_act,
            "seed": params.seed,
            "threads": params.threads,
            "samples": len(samples),
            "seq_length": len(samples[0]),
            **opts,
        },
        "calibration_sha256": calibration_digest(samples),
        "quantization_config": qc,
        "files": sorted(p.name for p in out_dir.iterdir()),
    }


def _int(name: str, value: Any, method: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LlmbuildError(f"{method}: {name} must be an integer, got {value!r}")
    return value


def _resolve_options(method: str, known: Mapping[str, Option], given: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults overridden by `given`; an unknown name, a wrong type or a value outside the choices is
    an error naming the option."""
    for name in given:
        if name not in known:
            raise LlmbuildError(f"{method}: options.{name} is not an option of {method}; known: {', '.join(known)}")
    resolved = {}
    for name, option in known.items():
        value = given.get(name, option.default)
        kinds = option.kind if isinstance(option.kind, tuple) else (option.kind,)
        # bool is an int in Python; an option that wants a number must not take true/false.
        if value is not None and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
            if float in kinds and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            else:
                wanted = " or ".join(k.__name__ for k in kinds)
                raise LlmbuildError(f"{method}: options.{name} must be {wanted}, got {value!r}")
        if option.choices and value not in option.choices:
            raise LlmbuildError(
                f"{method}: options.{name} must be one of {', '.join(map(str, option.choices))}, got {value!r}"
            )
        resolved[name] = value
    return resolved


def _check_params(method: str, p: QuantParams, supported_bits: tuple[int, ...], spec: Any) -> None:
    if isinstance(p.bits, bool) or p.bits not in supported_bits:
        raise LlmbuildError(f"{method}: bits must be one of {', '.join(map(str, supported_bits))}, got {p.bits!r}")
    for name in ("sym", "desc_act"):
        if not isinstance(getattr(p, name), bool):
            raise LlmbuildError(f"{method}: {name} must be true or false, got {getattr(p, name)!r}")
    g = p.group_size
    if isinstance(g, bool) or not isinstance(g, int) or (g <= 0 and g != -1):
        raise LlmbuildError(f"{method}: group_size must be a positive integer or -1 (per channel), got {g!r}")
    # Every projection's input width: q/k/v/gate/up read hidden, o reads heads*head_dim, down reads the MLP.
    widths = {"hidden_size": spec.hidden_size, "num_attention_heads*head_dim": spec.num_heads * spec.head_dim,
              "intermediate_size": spec.intermediate_size}  # fmt: skip
    for name, k in widths.items():
        if g > 0 and k % g:
            raise LlmbuildError(f"{method}: group_size {g} does not divide {name} {k} of the float checkpoint")


def _check_calibration(method: str, ids: Any, vocab_size: int) -> list[list[int]]:
    if not isinstance(ids, list) or not ids or not all(isinstance(s, list) and s for s in ids):
        raise LlmbuildError(f"{method}: calibration_ids must be a non-empty list of non-empty token id lists")
    lengths = {len(s) for s in ids}
    if len(lengths) != 1:
        # AutoRound takes one seqlen and AutoAWQ re-cuts the concatenation into equal blocks: equal windows
        # keep every library's view of the data the same.
        raise LlmbuildError(f"{method}: calibration samples must have one length, got {sorted(lengths)}")
    for i, sample in enumerate(ids):
        bad = next(
            (t for t in sample if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size), None
        )
        if bad is not None:
            raise LlmbuildError(f"{method}: calibration sample {i} has token id {bad!r} outside [0, {vocab_size})")
    return [list(s) for s in ids]


def check_options(method: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The method's options with `options` applied (what a recipe's `quantization.options` means), checked
    without importing the library: a recipe with a misspelt option fails when it loads."""
    entry = METHODS.get(method)
    if entry is None:
        raise LlmbuildError(f"quantization method {method!r} is not known; expected one of {', '.join(METHODS)}")
    driver = importlib.import_module(entry.module)
    return _resolve_options(method, {**COMMON_OPTIONS, **driver.OPTIONS}, options)

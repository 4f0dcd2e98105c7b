"""`quantization_config` (config.json) -> QuantConfigInfo: which library wrote the checkpoint and how.

Every supported checkpoint resolves to one of three tensor layouts (`layout`):
- "gptq": qweight int32 [K/pf, N] packed along K, qzeros [K/g, N/pf], scales [K/g, N], optional g_idx;
  `zero_offset` 1 when zero points are stored minus one (GPTQ v1, AutoRound's auto_gptq packing).
- "awq": qweight int32 [K, N/8] packed along N in the order 0,2,4,6,1,3,5,7; qzeros likewise; no offset.
- "pack-quantized": compressed-tensors, weight_packed int32 [N, K/pf] packed along K.

Defaults for absent fields are the writing library's own defaults (named beside each); a field with no
safe default (bits, group_size) is an error naming it. In particular an AWQ config without group_size is
an error, not AutoAWQ's default of 128: repacks that drop the field are common, a wrong group size
dequantizes to garbage without any other symptom, and the checkpoint's author knows the right value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmbuild import LlmbuildError

SUPPORTED_BITS = (4, 8)
_AUTO_ROUND_PACKINGS = {"auto_round:auto_gptq": "gptq", "auto_round:auto_awq": "awq"}


@dataclass(frozen=True)
class QuantConfigInfo:
    method: str  # "gptq", "awq", "auto-round" or "compressed-tensors" (quant_method)
    bits: int
    group_size: int  # -1: one group per output channel
    sym: bool
    desc_act: bool  # act order: rows quantized in activation order, g_idx not k // g
    checkpoint_format: str  # as written: "gptq", "gptq_v2", "gemm", "auto_round", "pack-quantized"
    packing_format: str  # as written (AutoRound's packing_format; else the layout's name)
    layout: str  # "gptq", "awq" or "pack-quantized": how the tensors are packed
    zero_offset: int = 0  # stored zero = zero - zero_offset (GPTQ v1 stores zero - 1)
    provider: str | None = None  # "auto-round" when AutoRound wrote a gptq/awq checkpoint
    ignore: tuple[str, ...] = field(default=())  # module names left unquantized (lm_head, ...)


def detect_quantization(config: Mapping[str, Any], origin: str = "config.json") -> QuantConfigInfo:
    """Read config.json's `quantization_config` (or a bare quantization config / quantize_config.json)."""
    qc = config.get("quantization_config", config if "quant_method" in config else None)
    if not isinstance(qc, Mapping):
        raise LlmbuildError(f"{origin}: missing field 'quantization_config'; not a quantized checkpoint")
    where = f"{origin}: quantization_config"
    method = qc.get("quant_method")
    if method is None and "checkpoint_format" in qc:
        method = "gptq"  # quantize_config.json of gptqmodel / auto-gptq omits quant_method
    if method == "gptq":
        return _gptq(qc, where)
    if method == "awq":
        return _awq(qc, where)
    if method in ("auto-round", "intel/auto-round"):
        return _auto_round(qc, where)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, where)
    raise LlmbuildError(
        f"{where}.quant_method: unsupported {method!r}; supported: gptq, awq, auto-round, compressed-tensors"
    )


def _need(qc: Mapping[str, Any], key: str, where: str, *aliases: str) -> Any:
    for k in (key, *aliases):
        if k in qc and qc[k] is not None:
            return qc[k]
    raise LlmbuildError(f"{where}: missing field {key!r} ({qc.get('quant_method', '?')} checkpoints need it)")


def _bits(qc: Mapping[str, Any], where: str, *aliases: str, key: str = "bits") -> int:
    bits = _need(qc, key, where, *aliases)
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in SUPPORTED_BITS:
        raise LlmbuildError(f"{where}.{key}: unsupported bits {bits!r}; supported: 4, 8")
    return bits


def _group_size(qc: Mapping[str, Any], where: str, *aliases: str) -> int:
    g = _need(qc, "group_size", where, *aliases)
    if isinstance(g, bool) or not isinstance(g, int) or (g <= 0 and g != -1):
        raise LlmbuildError(f"{where}.group_size: expected a positive integer or -1 (per channel), got {g!r}")
    return g


def _flag(qc: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    value = qc.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise LlmbuildError(f"{where}.{key}: expected true or false, got {value!r}")
    return value


def _gptq(qc: Mapping[str, Any], where: str) -> QuantConfigInfo:
    # checkpoint_format absent = "gptq" (v1): what auto-gptq wrote before the field existed.
    fmt = qc.get("checkpoint_format") or "gptq"
    if fmt not in ("gptq", "gptq_v2"):
        raise LlmbuildError(f"{where}.checkpoint_format: unsupported {fmt!r}; supported: gptq, gptq_v2")
    return QuantConfigInfo(
        method="gptq",
        bits=_bits(qc, where),
        group_size=_group_size(qc, where),
        sym=_flag(qc, "sym", True, where),  # gptqmodel / auto-gptq default
        desc_act=_flag(qc, "desc_act", False, where),
        checkpoint_format=fmt,
        packing_format=fmt,
        layout="gptq",
        zero_offset=1 if fmt == "gptq" else 0,
        provider=qc.get("provider"),
        ignore=tuple(qc.get("modules_to_not_convert") or ()),
    )


def _awq(qc: Mapping[str, Any], where: str) -> QuantConfigInfo:
    version = str(qc.get("version") or "gemm").lower()  # AutoAWQ's default version
    if version != "gemm":
        raise LlmbuildError(f"{where}.version: unsupported AWQ version {version!r}; supported: gemm")
    bits = _bits(qc, where, "w_bit")  # w_bit / q_group_size: AutoAWQ's quant_config.json names
    if bits != 4:
        raise LlmbuildError(f"{where}.bits: unsupported bits {bits} for AWQ gemm; supported: 4")
    return QuantConfigInfo(
        method="awq",
        bits=bits,
        group_size=_group_size(qc, where, "q_group_size"),
        sym=not _flag(qc, "zero_point", True, where),  # zeros are read from qzeros either way
        desc_act=False,
        checkpoint_format="gemm",
        packing_format="awq",
        layout="awq",
        provider=qc.get("provider"),
        ignore=tuple(qc.get("modules_to_not_convert") or ()),
    )


def _auto_round(qc: Mapping[str, Any], where: str) -> QuantConfigInfo:
    # auto-round's loader assumes auto_gptq packing when packing_format is absent (older exports).
    packing = qc.get("packing_format") or "auto_round:auto_gptq"
    layout = _AUTO_ROUND_PACKINGS.get(packing)
    if layout is None:
        raise LlmbuildError(
            f"{where}.packing_format: unsupported {packing!r}; supported: {', '.join(_AUTO_ROUND_PACKINGS)}"
        )
    data_type = qc.get("data_type", "int")
    if data_type != "int":
        raise LlmbuildError(f"{where}.data_type: unsupported {data_type!r}; supported: int")
    bits = _bits(qc, where)
    if layout == "awq" and bits != 4:
        raise LlmbuildError(f"{where}.bits: unsupported bits {bits} with {packing}; supported: 4")
    return QuantConfigInfo(
        method="auto-round",
        bits=bits,
        group_size=_group_size(qc, where),
        sym=_flag(qc, "sym", True, where),  # auto-round's default
        desc_act=False,  # auto-round does not reorder rows: no g_idx
        checkpoint_format="auto_round",
        packing_format=packing,
        layout=layout,
        zero_offset=1 if layout == "gptq" else 0,  # auto_gptq packing stores zero - 1 like GPTQ v1
        provider="auto-round",
        ignore=tuple(qc.get("modules_to_not_convert") or ()),
    )


def _compressed_tensors(qc: Mapping[str, Any], where: str) -> QuantConfigInfo:
    fmt = qc.get("format")
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise LlmbuildError(f"{where}: missing field 'config_groups' (compressed-tensors checkpoints need it)")
    schemes = []
    for name, group in groups.items():
        gwhere = f"{where}.config_groups.{name}"
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(weights, Mapping):
            raise LlmbuildError(f"{gwhere}: missing field 'weights'")
        gfmt = group.get("format") or fmt
        if gfmt != "pack-quantized":
            raise LlmbuildError(f"{gwhere}.format: unsupported {gfmt!r}; supported: pack-quantized")
        if weights.get("type", "int") != "int":
            raise LlmbuildError(f"{gwhere}.weights.type: unsupported {weights.get('type')!r}; supported: int")
        strategy = weights.get("strategy")
        if strategy == "group":
            g = _group_size(weights, f"{gwhere}.weights")
        elif strategy == "channel":
            g = -1
        else:
            raise LlmbuildError(f"{gwhere}.weights.strategy: unsupported {strategy!r}; supported: group, channel")
        bits = _bits(weights, f"{gwhere}.weights", key="num_bits")
        sym = _flag(weights, "symmetric", True, f"{gwhere}.weights")
        # "group" / "dynamic" (removed in compressed-tensors 0.19) store weight_g_idx; "weight" / "static"
        # only reorder during calibration and save the rows in their original order.
        actorder = weights.get("actorder")
        schemes.append((bits, g, sym, actorder in ("group", "dynamic", True)))
    if len(set(schemes)) != 1:
        raise LlmbuildError(f"{where}.config_groups: groups with different weight schemes are not supported")
    bits, g, sym, act = schemes[0]
    return QuantConfigInfo(
        method="compressed-tensors",
        bits=bits,
        group_size=g,
        sym=sym,
        desc_act=act,
        checkpoint_format="pack-quantized",
        packing_format="pack-quantized",
        layout="pack-quantized",
        ignore=tuple(qc.get("ignore") or ()),
    )

"""Readers: one quantized linear layer of a checkpoint -> the canonical QuantizedLinear.

Each reader only unpacks words and re-indexes (no arithmetic on scales), so the result dequantizes bit
for bit as the writing library does. Layouts (K = in_features, N = out_features, g = group size,
pf = 32 / bits values per int32 word):

  gptq            qweight [K/pf, N] (along K, value j of a word at bits j*bits), qzeros [K/g, N/pf]
                  (along N), scales [K/g, N], g_idx [K] (optional unless act order), bias [N].
                  zero_offset 1 (GPTQ v1, AutoRound auto_gptq): stored zeros are zero - 1. gptqmodel
                  writes them by subtracting 0x11111111 from each whole word and reads them back by
                  adding it (borrows and carries included), so we undo it the same way, per word.
  awq             qweight [K, N/8], qzeros [K/g, N/8], both along N with nibble p holding column
                  ORDER[p] = 0,2,4,6,1,3,5,7; scales [K/g, N]; zeros as stored.
  pack-quantized  weight_packed [N, K/pf] (along K), weight_scale [N, K/g], weight_shape [2],
                  weight_zero_point [N/pf, K/g] packed along N (asymmetric only), weight_g_idx
                  optional. Levels and zero points are stored as signed value + 2^(bits-1), so the
                  stored unsigned fields are our levels directly; symmetric implies zero 2^(bits-1).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.quant.config import QuantConfigInfo
from llmbuild.quant.linear import QuantizedLinear
from llmbuild.quant.tensors import TensorReader

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble p of a word holds column 8w + AWQ_ORDER[p]
PRIMARY_TENSOR = {"gptq": "qweight", "awq": "qweight", "pack-quantized": "weight_packed"}
# numpy's dtype kind of each safetensors dtype, to check a tensor from its header alone.
_HEADER_KINDS = {"F64": "f", "F32": "f", "F16": "f", "BF16": "f", "I64": "i", "I32": "i", "I16": "i", "I8": "i",
                 "U64": "u", "U32": "u", "U16": "u", "U8": "u", "BOOL": "b"}


@dataclass(frozen=True)
class _Plan:
    """A layer's dimensions and every tensor it must hold, worked out from the headers alone."""

    n: int
    k: int
    g: int
    groups: int
    why: str
    tensors: dict[str, tuple[tuple[int, ...], str, str]]  # suffix -> (shape, why, dtype kinds)

    def read(self, layer: _Layer, suffix: str) -> np.ndarray:
        return layer.read(suffix, *self.tensors[suffix])


def _as_words(words: np.ndarray) -> np.ndarray:
    """Integer words as uint32 bit patterns (two's complement reinterpreted, i.e. value mod 2^32): a view
    for 32-bit integers, a modular cast otherwise, never a wider temporary."""
    if words.dtype.kind not in "iu":
        raise LlmbuildError(f"packed words must be integers, got {words.dtype}")
    if words.dtype.itemsize == 4:
        return np.ascontiguousarray(words).view(np.uint32)
    return words.astype(np.uint32)


def _field(w: np.ndarray, position: int, bits: int, scratch: np.ndarray) -> np.ndarray:
    """Field `position` of every word, in `scratch` (uint32, w's shape): one word-sized temporary reused
    for every field, where a whole [.., pf, ..] int64 array is 2 * pf times the packed size."""
    np.right_shift(w, np.uint32(position * bits), out=scratch)
    return np.bitwise_and(scratch, np.uint32((1 << bits) - 1), out=scratch)


def unpack_along_rows(words: np.ndarray, bits: int) -> np.ndarray:
    """int32 [R, C] -> uint8 [R * pf, C]: row r * pf + j is field j (bits j*bits..) of word row r."""
    pf = 32 // bits
    w = _as_words(words)
    out = np.empty((w.shape[0], pf, w.shape[1]), dtype=np.uint8)
    scratch = np.empty_like(w)
    for j in range(pf):
        out[:, j, :] = _field(w, j, bits, scratch)  # fields are < 2^bits: exact in uint8
    return out.reshape(w.shape[0] * pf, w.shape[1])


def unpack_along_cols(words: np.ndarray, bits: int, order: tuple[int, ...] | None = None) -> np.ndarray:
    """int32 [R, C] -> uint8 [R, C * pf]: column c * pf + order[p] is field p of word column c."""
    pf = 32 // bits
    w = _as_words(words)
    if bits == 4 and sys.byteorder == "little":
        # Byte b of a little-endian word holds fields 2b (low nibble) and 2b + 1 (high nibble): two passes
        # over the bytes instead of eight over the words (the streamed reference unpacks a 7B's every
        # projection for every token it generates).
        octets = w.view(np.uint8).reshape(w.shape[0], w.shape[1], 4)
        out = np.empty((w.shape[0], w.shape[1], pf), dtype=np.uint8)
        if order is None:
            pairs = out.reshape(w.shape[0], w.shape[1], 4, 2)
            np.bitwise_and(octets, np.uint8(15), out=pairs[..., 0])
            np.right_shift(octets, np.uint8(4), out=pairs[..., 1])
        else:
            out[..., list(order[0::2])] = octets & np.uint8(15)
            out[..., list(order[1::2])] = octets >> np.uint8(4)
        return out.reshape(w.shape[0], w.shape[1] * pf)
    out = np.empty((w.shape[0], w.shape[1], pf), dtype=np.uint8)
    scratch = np.empty_like(w)
    for p in range(pf):
        out[:, :, p if order is None else order[p]] = _field(w, p, bits, scratch)  # position p -> column order[p]
    return out.reshape(w.shape[0], w.shape[1] * pf)


def _repeat_word(value: int, bits: int) -> int:
    """`value` in every field of a 32-bit word (0x11111111 for 1 in 4-bit fields)."""
    return sum(value << (bits * j) for j in range(32 // bits))


class _Layer:
    """Tensor access for one layer, with errors that name the tensor, its shape and the expected shape."""

    def __init__(self, tensors: TensorReader, prefix: str, info: QuantConfigInfo) -> None:
        self.tensors, self.prefix, self.info = tensors, prefix, info

    def name(self, suffix: str) -> str:
        return f"{self.prefix}.{suffix}"

    def has(self, suffix: str) -> bool:
        return self.name(suffix) in self.tensors

    def shape(self, suffix: str) -> tuple[int, ...]:
        self.require(suffix)
        return self.tensors.shape(self.name(suffix))

    def require(self, suffix: str) -> None:
        if not self.has(suffix):
            raise LlmbuildError(
                f"{self.tensors.origin}: missing tensor {self.name(suffix)!r} "
                f"(a {self.info.method} {self.info.packing_format} layer needs it)"
            )

    def check(self, suffix: str, expected: tuple[int, ...], why: str, kinds: str = "") -> None:
        """Shape, and dtype where the reader knows it from the header, without reading the data."""
        shape = self.shape(suffix)
        if shape != expected:
            raise LlmbuildError(
                f"{self.tensors.origin}: tensor {self.name(suffix)!r} has shape {list(shape)}, "
                f"expected {list(expected)} ({why})"
            )
        header_dtype = getattr(self.tensors, "dtype", None)
        if kinds and header_dtype is not None:
            dtype = header_dtype(self.name(suffix))
            self._check_kind(suffix, dtype, _HEADER_KINDS.get(dtype, "?"), kinds)

    def read(self, suffix: str, expected: tuple[int, ...], why: str, kinds: str = "") -> np.ndarray:
        self.check(suffix, expected, why, kinds)
        array = self.tensors.read(self.name(suffix))
        if kinds:
            self._check_kind(suffix, str(array.dtype), array.dtype.kind, kinds)
        return array

    def _check_kind(self, suffix: str, dtype: str, kind: str, kinds: str) -> None:
        if kind not in kinds:
            want = "a float" if kinds == "f" else "an integer"
            raise LlmbuildError(
                f"{self.tensors.origin}: tensor {self.name(suffix)!r} has dtype {dtype}, expected {want} dtype"
            )

    def bias(self, n: int) -> np.ndarray | None:
        if not self.has("bias"):
            return None
        return self.read("bias", (n,), f"out_features {n}", "f").astype(np.float32)


def read_linear(
    tensors: TensorReader, prefix: str, info: QuantConfigInfo, shape: tuple[int, int] | None = None
) -> QuantizedLinear:
    """The layer whose tensors are named `prefix`.qweight etc. `shape` = (N, K) from the model's config
    when known (then every tensor is checked against it); else N and K come from the packed weight."""
    layer = _Layer(tensors, prefix, info)
    if info.layout == "gptq":
        return _read_gptq(layer, shape)
    if info.layout == "awq":
        return _read_awq(layer, shape)
    if info.layout == "pack-quantized":
        return _read_pack_quantized(layer, shape)
    raise LlmbuildError(f"unsupported quantized layout {info.layout!r}")


def check_linear(
    tensors: TensorReader, prefix: str, info: QuantConfigInfo, shape: tuple[int, int] | None = None
) -> None:
    """What `read_linear` would refuse about the layer's shapes and dtypes, from the headers alone (the
    quantization metadata against the packed tensors, milliseconds for a 7B): `llmbuild prepare` runs it
    on every layer before any job reads one."""
    layer = _Layer(tensors, prefix, info)
    planners = {"gptq": _plan_gptq, "awq": _plan_awq, "pack-quantized": _plan_pack_quantized}
    if info.layout not in planners:
        raise LlmbuildError(f"unsupported quantized layout {info.layout!r}")
    plan = planners[info.layout](layer, shape)
    for suffix, expected in plan.tensors.items():
        layer.check(suffix, *expected)
    g_idx = "g_idx" if info.layout == "gptq" else "weight_g_idx"
    if info.layout != "awq" and (layer.has(g_idx) or info.desc_act):
        layer.check(g_idx, (plan.k,), plan.why, "iu")
    if layer.has("bias"):
        layer.check("bias", (plan.n,), f"out_features {plan.n}", "f")


def _groups(layer: _Layer, k: int) -> tuple[int, int]:
    """(group size, number of groups) for in_features k; per channel (-1) is one group of k."""
    g = k if layer.info.group_size == -1 else layer.info.group_size
    if k % g:
        raise LlmbuildError(
            f"{layer.tensors.origin}: layer {layer.prefix!r}: group_size {g} does not divide in_features {k}"
        )
    return g, k // g


def _dims(
    layer: _Layer, shape: tuple[int, int] | None, suffix: str, from_packed: Callable[[tuple[int, ...]], tuple[int, int]]
) -> tuple[int, int, str]:
    """(N, K, where they came from): the model config when given, else the packed weight's shape."""
    if shape is not None:
        n, k = shape
        return n, k, f"in_features {k}, out_features {n} from config.json"
    packed = layer.shape(suffix)
    if len(packed) != 2:
        raise LlmbuildError(
            f"{layer.tensors.origin}: tensor {layer.name(suffix)!r} has shape {list(packed)}, expected 2 dimensions"
        )
    n, k = from_packed(packed)
    return n, k, f"in_features {k}, out_features {n} from {suffix}"


def _g_idx(layer: _Layer, suffix: str, k: int, g: int, groups: int, why: str) -> np.ndarray | None:
    """g_idx as int32, or None when it is the trivial k // g (so consumers see act order only when real)."""
    if not layer.has(suffix):
        if layer.info.desc_act:
            layer.require(suffix)  # act order without g_idx cannot be dequantized
        return None
    g_idx = layer.read(suffix, (k,), why, "iu").astype(np.int64)
    if g_idx.min(initial=0) < 0 or g_idx.max(initial=0) >= groups:
        raise LlmbuildError(
            f"{layer.tensors.origin}: tensor {layer.name(suffix)!r} has values outside [0, {groups}) "
            f"(groups of {g} over in_features {k})"
        )
    if np.array_equal(g_idx, np.arange(k) // g):
        return None
    return g_idx.astype(np.int32)


def _plan_gptq(layer: _Layer, shape: tuple[int, int] | None) -> _Plan:
    bits = layer.info.bits
    pf = 32 // bits
    n, k, why = _dims(layer, shape, "qweight", lambda s: (s[1], s[0] * pf))
    if n % pf or k % pf:
        raise LlmbuildError(f"{layer.tensors.origin}: layer {layer.prefix!r}: in/out features {k}/{n} are not "
                            f"multiples of {pf} ({bits}-bit GPTQ packing)")  # fmt: skip
    g, groups = _groups(layer, k)
    grouped = why + f", group_size {g}"
    return _Plan(n, k, g, groups, why, {"qweight": ((k // pf, n), why, "iu"),
                                        "qzeros": ((groups, n // pf), grouped, "iu"),
                                        "scales": ((groups, n), grouped, "f")})


def _read_gptq(layer: _Layer, shape: tuple[int, int] | None) -> QuantizedLinear:
    plan = _plan_gptq(layer, shape)
    bits, n, k, g, groups, why = layer.info.bits, plan.n, plan.k, plan.g, plan.groups, plan.why
    qweight, qzeros, scales = (plan.read(layer, suffix) for suffix in ("qweight", "qzeros", "scales"))
    if layer.info.zero_offset:
        # Undo "stored = zero - 1" on whole words, exactly as gptqmodel's v1 -> v2 conversion does.
        offset = _repeat_word(layer.info.zero_offset, bits)
        qzeros = (qzeros.astype(np.int64) + offset) & 0xFFFFFFFF
    # Field j of word row r is input row r * pf + j: unpacking the transposed words along columns gives
    # [N, K] directly (a view of it is the [K, N] levels), so _from_k_major's transpose copies nothing
    # and only the words (half the levels' bytes at 4 bits) are transposed.
    q = unpack_along_cols(np.ascontiguousarray(qweight.T), bits).T  # [K, N]
    zero = unpack_along_cols(qzeros, bits)  # [K/g, N]
    return _from_k_major(q, scales, zero, g, bits, layer.bias(n), _g_idx(layer, "g_idx", k, g, groups, why))


def _plan_awq(layer: _Layer, shape: tuple[int, int] | None) -> _Plan:
    bits = layer.info.bits
    pf = 32 // bits
    n, k, why = _dims(layer, shape, "qweight", lambda s: (s[1] * pf, s[0]))
    if n % pf:
        raise LlmbuildError(f"{layer.tensors.origin}: layer {layer.prefix!r}: out_features {n} is not a "
                            f"multiple of {pf} (AWQ packing)")  # fmt: skip
    g, groups = _groups(layer, k)
    grouped = why + f", group_size {g}"
    return _Plan(n, k, g, groups, why, {"qweight": ((k, n // pf), why, "iu"),
                                        "qzeros": ((groups, n // pf), grouped, "iu"),
                                        "scales": ((groups, n), grouped, "f")})


def _read_awq(layer: _Layer, shape: tuple[int, int] | None) -> QuantizedLinear:
    plan = _plan_awq(layer, shape)
    bits, n, g = layer.info.bits, plan.n, plan.g
    qweight, qzeros, scales = (plan.read(layer, suffix) for suffix in ("qweight", "qzeros", "scales"))
    q = unpack_along_cols(qweight, bits, AWQ_ORDER)  # [K, N]
    zero = unpack_along_cols(qzeros, bits, AWQ_ORDER)  # [K/g, N]
    return _from_k_major(q, scales, zero, g, bits, layer.bias(n))


def _from_k_major(
    q: np.ndarray, scales: np.ndarray, zero: np.ndarray, g: int, bits: int, bias: np.ndarray | None,
    g_idx: np.ndarray | None = None,
) -> QuantizedLinear:
    """GPTQ and AWQ store [K, N]-major tensors; QuantizedLinear keeps the checkpoint's [N, K] layout."""
    return QuantizedLinear(
        q=np.ascontiguousarray(q.T),
        scale=np.ascontiguousarray(scales.astype(np.float32).T),
        zero=np.ascontiguousarray(zero.astype(np.float32).T),
        group_size=g,
        bits=bits,
        g_idx=g_idx,
        bias=bias,
    )


def _plan_pack_quantized(layer: _Layer, shape: tuple[int, int] | None) -> _Plan:
    bits = layer.info.bits
    pf = 32 // bits
    if layer.has("weight_shape"):
        stored = [int(v) for v in layer.read("weight_shape", (2,), "[out_features, in_features]", "iu")]
        if shape is not None and tuple(stored) != tuple(shape):
            raise LlmbuildError(f"{layer.tensors.origin}: tensor {layer.name('weight_shape')!r} holds {stored}, "
                                f"expected {list(shape)} from config.json")  # fmt: skip
        shape = (stored[0], stored[1])
    n, k, why = _dims(layer, shape, "weight_packed", lambda s: (s[0], s[1] * pf))
    if k % pf:
        raise LlmbuildError(f"{layer.tensors.origin}: layer {layer.prefix!r}: in_features {k} is not a "
                            f"multiple of {pf} ({bits}-bit packing)")  # fmt: skip
    g, groups = _groups(layer, k)
    grouped = why + f", group_size {g}"
    tensors = {"weight_packed": ((n, k // pf), why, "iu"), "weight_scale": ((n, groups), grouped, "f")}
    if layer.has("weight_zero_point"):
        # Unpacked signed zero points (older compressed-tensors), or packed along N like the weights.
        unpacked = layer.shape("weight_zero_point") == (n, groups)
        tensors["weight_zero_point"] = ((n, groups) if unpacked else (-(-n // pf), groups), grouped, "iu")
    elif not layer.info.sym:
        layer.require("weight_zero_point")  # asymmetric needs them
    return _Plan(n, k, g, groups, why, tensors)


def _read_pack_quantized(layer: _Layer, shape: tuple[int, int] | None) -> QuantizedLinear:
    plan = _plan_pack_quantized(layer, shape)
    bits, n, k, g, groups, why = layer.info.bits, plan.n, plan.k, plan.g, plan.groups, plan.why
    packed = plan.read(layer, "weight_packed")
    scale = plan.read(layer, "weight_scale").astype(np.float32)
    mid = 1 << (bits - 1)
    if "weight_zero_point" in plan.tensors:
        zp = plan.read(layer, "weight_zero_point")
        if zp.shape == (n, groups):  # unpacked signed zero points
            zero = zp.astype(np.float32) + mid
        else:  # packed along N, stored as signed + 2^(bits-1)
            zero = unpack_along_rows(zp, bits)[:n].astype(np.float32)
    else:
        zero = np.full((n, groups), mid, dtype=np.float32)
    return QuantizedLinear(
        q=np.ascontiguousarray(unpack_along_cols(packed, bits)),
        scale=scale,
        zero=zero,
        group_size=g,
        bits=bits,
        g_idx=_g_idx(layer, "weight_g_idx", k, g, groups, why),
        bias=layer.bias(n),
    )

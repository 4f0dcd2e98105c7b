"""GGUF tensors dequantized with the gguf library's arithmetic, faster.

The GGUF reference re-reads every decoder layer it does not keep resident once per generated token, so
dequantization is on the reference step's critical path (SmolLM2's Q4_1 file: about 200 layer reads and
nine reads of the Q8_0 embedding table a build).

- Q4_0, Q4_1 and Q8_0, the types llama.cpp writes most, have kernels here. Each writes its nibbles or
  bytes straight into the float32 output, a cache-sized chunk of blocks at a time, and then applies the
  block's scale (and minimum) in place. The operations and their order are the gguf library's
  (`(d * q) + m` in float32, each rounded once; numpy fuses nothing), so the bits are its bits. This is
  checked against `gguf.quants.dequantize` in tests/test_frontend_gguf.py, on every tensor of the SmolLM2
  file and on random data of each type.
- Every other type goes through the library's own `dequantize_rows`, called on chunks of rows rather
  than the 16-row groups of `gguf.quants.dequantize` (each call splits and reshapes its blocks anew, so
  fewer calls is most of the gain). Every block is dequantized on its own, so the chunking does not change
  a value.

Measured on SmolLM2's file, one thread: a decoder layer's seven Q4_1 projections 9.8 -> 6.8 ms, the
49152-row Q8_0 embedding table 121 -> 44 ms.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

CHUNK_VALUES = 1 << 16  # dequantized values a step: 256 KiB of float32, in the L2 cache with its blocks


def _scales(blocks: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Bytes lo..hi of every block, float16 words, widened to float32 [blocks, words]."""
    return np.ascontiguousarray(blocks[:, lo:hi]).view(np.float16).astype(np.float32)


def _q8_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # Block: float16 d, 32 int8 q; value d * q.
    d = _scales(blocks, 0, 2)
    step = CHUNK_VALUES // 32
    for lo in range(0, len(blocks), step):
        o = out[lo : lo + step]
        o[...] = blocks[lo : lo + step, 2:].view(np.int8)
        o *= d[lo : lo + step]


def _nibbles(qs: np.ndarray, o: np.ndarray) -> None:
    """A 4-bit block's 16 bytes into 32 floats: the low nibbles first, then the high ones (llama.cpp's
    order)."""
    np.bitwise_and(qs, np.uint8(0x0F), out=o[:, :16], casting="unsafe")
    np.right_shift(qs, np.uint8(4), out=o[:, 16:], casting="unsafe")


def _q4(blocks: np.ndarray, out: np.ndarray, with_minimum: bool) -> None:
    # Q4_0 block: float16 d, 16 bytes of nibbles; value d * (q - 8).
    # Q4_1 block: float16 d, float16 m, 16 bytes of nibbles; value d * q + m.
    head = 4 if with_minimum else 2
    dm = _scales(blocks, 0, head)
    step = CHUNK_VALUES // 32
    for lo in range(0, len(blocks), step):
        o = out[lo : lo + step]
        _nibbles(blocks[lo : lo + step, head:], o)
        if not with_minimum:
            o -= np.float32(8)
        o *= dm[lo : lo + step, 0:1]
        if with_minimum:
            o += dm[lo : lo + step, 1:2]


_KERNELS: dict[str, Callable[[np.ndarray, np.ndarray], None]] = {
    "Q4_0": lambda blocks, out: _q4(blocks, out, with_minimum=False),
    "Q4_1": lambda blocks, out: _q4(blocks, out, with_minimum=True),
    "Q8_0": _q8_0,
}


@cache
def _quant_classes() -> dict[Any, Any]:
    """GGML type -> the gguf library's class with its `dequantize_rows` (Q4_0, Q4_1, Q8_0, the K quants)."""
    import gguf.quants as quants

    found = {}
    for value in vars(quants).values():
        if isinstance(value, type) and hasattr(value, "dequantize_rows") and isinstance(getattr(value, "qtype", None),
                                                                                           quants.GGMLQuantizationType):
            found[value.qtype] = value
    return found


def dequantize(data: np.ndarray, qtype: Any, out: np.ndarray | None = None) -> np.ndarray:
    """`gguf.quants.dequantize(data, qtype)`, bit for bit, as a new float32 array or written into `out`
    (float32, C-contiguous, of the result's shape)."""
    from gguf.quants import dequantize as whole

    quant = _quant_classes().get(qtype)
    raw = np.asarray(data)
    if quant is None or raw.ndim < 1 or raw.dtype != np.uint8 or raw.shape[-1] % quant.type_size:
        values = whole(data, qtype)  # floats, and anything not laid out as whole blocks per row
        if out is None:
            return values
        out[...] = values
        return out
    width = raw.shape[-1] // quant.type_size * quant.block_size
    shape = (*raw.shape[:-1], width)
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"dequantize: out must be C-contiguous float32 {list(shape)}")
    kernel = _KERNELS.get(getattr(qtype, "name", ""))
    if kernel is not None:
        kernel(raw.reshape(-1, quant.type_size), out.reshape(-1, quant.block_size))
        return out
    rows, values = raw.reshape(-1, raw.shape[-1]), out.reshape(-1, width)
    step = max(1, CHUNK_VALUES // width)
    for lo in range(0, rows.shape[0], step):
        values[lo : lo + step] = quant.dequantize_rows(rows[lo : lo + step])
    return out

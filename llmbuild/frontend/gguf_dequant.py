"""GGUF tensors dequantized with the gguf library's own block arithmetic, in larger chunks.

`gguf.quants.dequantize` applies a type's `dequantize_rows` to groups of 16 rows, and each call splits
and reshapes its blocks anew: for SmolLM2's Q4_1 file that overhead was most of the reference step's
reading (64,000 calls, 2.8 s of its 10 s). Every block is dequantized on its own, so calling the same
`dequantize_rows` on chunks of rows gives the same values whatever the chunking (checked against
`gguf.quants.dequantize` in tests/test_frontend_gguf.py); only the number of calls changes.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

CHUNK_VALUES = 1 << 16  # dequantized values a call: 256 KiB of float32, in the L2 cache with its blocks


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


def dequantize(data: np.ndarray, qtype: Any) -> np.ndarray:
    """`gguf.quants.dequantize(data, qtype)`, computed over chunks of rows."""
    from gguf.quants import dequantize as whole

    quant = _quant_classes().get(qtype)
    raw = np.asarray(data)
    if quant is None or raw.ndim < 1 or raw.dtype != np.uint8 or raw.shape[-1] % quant.type_size:
        return whole(data, qtype)  # floats, and anything not laid out as whole blocks per row
    rows = raw.reshape(-1, raw.shape[-1])
    width = raw.shape[-1] // quant.type_size * quant.block_size
    step = max(1, CHUNK_VALUES // width)
    out = np.empty((rows.shape[0], width), dtype=np.float32)
    for lo in range(0, rows.shape[0], step):
        out[lo : lo + step] = quant.dequantize_rows(rows[lo : lo + step])
    return out.reshape(*raw.shape[:-1], width)

"""Large float arrays handed back by a step that is done with one layer, for the next layer's weights.

A check job dequantizes each layer's projections twice (for the TopOp interpretation and for the host
path), into fresh arrays: 185 MB a layer for a 1.5B model, whose pages the kernel must fault in and zero
on this kind of VM at well under 1 GB/s. The layers of a job have the same shapes, so the arrays one layer
leaves are exactly what the next one needs: they are handed back here (only by code that knows nothing
still reads them) and `empty` returns them instead of new memory. The pool never holds more than what
was handed back, which a job held anyway the moment before.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

_free: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}


def empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """`np.empty(shape, dtype)`, from a handed-back array of that shape and type when there is one."""
    stack = _free.get((tuple(shape), np.dtype(dtype).str))
    if stack:
        array = stack.pop()
        array.flags.writeable = True
        return array
    return np.empty(shape, dtype=dtype)


def give_back(arrays: Iterable[object]) -> None:
    """Arrays the caller, and everything it handed them to, will not read again. Views and arrays that
    do not own their memory are left alone (another array may still see their bytes)."""
    for array in arrays:
        if isinstance(array, np.ndarray) and array.base is None and array.flags.owndata:
            _free.setdefault((array.shape, array.dtype.str), []).append(array)


def clear() -> None:
    _free.clear()

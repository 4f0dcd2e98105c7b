"""The address of a numpy array's first element, for the compiled kernels' ctypes calls, in a tenth of the time.

`ndarray.ctypes.data` builds a ctypes helper object on every access: 2.6 us, three of them per product,
and a SmolLM2 decode step makes some 600 kernel calls. The address is the array object's `data` field,
the first field after the object header in numpy's PyArrayObject (numpy/ndarraytypes.h), so it is read
there directly. The reading is checked against `ctypes.data` on a few arrays when this module loads; where
they disagree (another Python or numpy layout) `address` is `ctypes.data` itself.

The caller keeps the array alive for as long as the address is used (the kernels' calls do: the array is
an argument of the function that calls them).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

_HEADER = object.__basicsize__  # the object header before PyArrayObject's `data` field


def _from_object(a: np.ndarray) -> int:
    return ctypes.c_void_p.from_address(id(a) + _HEADER).value or 0


def _by_ctypes(a: np.ndarray) -> int:
    return a.ctypes.data


def _checked() -> Callable[[np.ndarray], int]:
    base = np.arange(64, dtype=np.float32)
    samples = [base, base[8:], base.reshape(8, 8)[:, 2:], np.empty(0, np.uint16), np.zeros((3, 5), np.uint8)]
    try:
        if all(_from_object(a) == a.ctypes.data for a in samples):
            return _from_object
    except (ValueError, OverflowError):
        pass
    return _by_ctypes


address: Callable[[np.ndarray], int] = _checked()

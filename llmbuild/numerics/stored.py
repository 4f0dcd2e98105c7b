"""A weight kept in its storage format and decoded only where a kernel reads it.

A 7B binary's weights do not fit a host's memory once decoded to float32 (a 4-bit projection becomes 8x
larger, a bf16 vocabulary table 2x), so the host path and the checks hand kernels a `StoredTensor`: the
raw bytes (a view into the memory-mapped binary or a layer's weight file) with the element type they are
stored in. Kernels read it by rows (`rows`, `take`); a matrix product reads the slices of output rows it
would compute anyway (`tile_n`), a Gather the rows it looks up. Decoding a slice gives exactly the values
decoding the whole tensor gives, so results do not depend on how a weight is held.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbuild.numerics.formats import STORAGE, decode, encode


class RowReader:
    """A read-only matrix that kernels read by rows (axis 0) and never need whole."""

    shape: tuple[int, ...]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def rows(self, lo: int, hi: int) -> np.ndarray:
        raise NotImplementedError

    def take(self, index: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def whole(self) -> np.ndarray:
        return self.rows(0, self.shape[0])

    def stored_rows(self, lo: int, hi: int, dtype: str) -> np.ndarray | None:
        """Rows lo:hi as the elements of storage type `dtype` (formats.STORAGE), when the reader holds them
        in that type already (a bf16 checkpoint's table written as bf16: no float32 round trip); None
        otherwise, and the caller encodes `rows`."""
        return None

    def rows_into(self, lo: int, hi: int, out: np.ndarray) -> None:
        """Rows lo:hi decoded into `out` (float32, shape [hi - lo, ...]): a buffer the caller reuses, so a
        matrix-vector product decodes each block where the product reads it, in the cache, instead of into
        fresh memory the kernel must fault in and zero."""
        out[...] = self.rows(lo, hi)


class StoredTensor(RowReader):
    """A read-only tensor in a storage format (`formats.STORAGE`), decoded to its compute type on read.
    `raw`: the stored elements, an ndarray or anything that slices and indexes by rows like one (a file
    read on demand, runtime/weight_image.FileArray)."""

    def __init__(self, raw: Any, dtype: str):
        self.raw = raw
        self.dtype = dtype
        self.shape = tuple(raw.shape)

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """Rows lo:hi along axis 0, decoded."""
        return decode(np.ascontiguousarray(self.raw[lo:hi]), self.dtype)

    def rows_into(self, lo: int, hi: int, out: np.ndarray) -> None:
        if self.dtype == "bf16":  # bf16 is the top half of a float32: widened into `out`, shifted there
            # (a widening copy, then a shift in place: 45% faster than one shift with a casting output)
            bits = out.view(np.uint32)
            bits[...] = np.asarray(self.raw[lo:hi], dtype=np.uint16)
            bits <<= 16
        else:
            super().rows_into(lo, hi, out)

    def take(self, index: np.ndarray) -> np.ndarray:
        """The rows at `index` (any shape), decoded: result shape index.shape + shape[1:]."""
        return decode(self.raw[np.asarray(index, dtype=np.int64)], self.dtype)


Weight = np.ndarray | RowReader


def row_slice(w: Weight, lo: int, hi: int) -> np.ndarray:
    """Rows lo:hi of a weight held either way."""
    return w.rows(lo, hi) if isinstance(w, RowReader) else w[lo:hi]


def take_rows(w: Weight, index: np.ndarray) -> np.ndarray:
    return w.take(index) if isinstance(w, RowReader) else w[np.asarray(index, dtype=np.int64)]


def materialize(w: Weight) -> np.ndarray:
    return w.whole() if isinstance(w, RowReader) else w


ENCODE_BLOCK_BYTES = 64 << 20


def encoded(w: Weight, dtype: str) -> np.ndarray:
    """`w` in storage type `dtype` (formats.STORAGE), encoded by blocks of rows: a 7B vocabulary table
    (545M values) never exists in float32 beside its 16-bit copy; rows the reader holds in `dtype` already
    are copied as they are."""
    if not isinstance(w, RowReader):
        return encode(np.asarray(w), dtype)
    out = np.empty(w.shape, dtype=STORAGE[dtype][1])
    row_bytes = 4 * max(1, int(np.prod(w.shape[1:])))
    step = max(1, ENCODE_BLOCK_BYTES // row_bytes)
    for lo in range(0, w.shape[0], step):
        hi = min(w.shape[0], lo + step)
        stored = w.stored_rows(lo, hi, dtype)
        out[lo:hi] = stored if stored is not None else encode(w.rows(lo, hi), dtype)
    return out


def is_lazy(*ws: object) -> bool:
    return any(isinstance(w, RowReader) for w in ws)

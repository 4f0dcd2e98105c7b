"""Round-to-nearest applied to a streamed reference's weights, as the build quantizes them.

Quantized in the build (origin rtn): the reference is the source model with each projection replaced by
its dequantized round-to-nearest weight (rtn is checked bit for bit against an independent numpy
implementation in tests/test_quant_formats.py), so the checks measure the compiler, not the rounding.
`quantization.lm_head`: lm_head's weight (the shared embedding table when tied, so the embedding rows
too) rounded the same way.

Round-to-nearest is row-local (8-bit: one scale per output row; 4-bit: groups along the input axis), so
rounding a block of rows, or the rows of the tokens used, gives exactly the bits of rounding the whole
matrix: nothing here needs a whole projection's temporaries or the whole vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from llmbuild.numerics.parallel import tile_map
from llmbuild.quant.scheme import QUANTIZED_PROJECTIONS, QuantScheme
from llmbuild.verify.stream_weights import (
    ROW_BLOCK,
    Buffers,
    LevelDeltas,
    LevelsCache,
    ReferenceWeights,
    buffer_for,
    dequantize_rows,
    levels_budget,
)


def round_rows(weight: torch.Tensor, scheme: QuantScheme, out: torch.Tensor | None = None) -> torch.Tensor:
    """The dequantized round-to-nearest of a float [N, K] weight, computed ROW_BLOCK rows at a time, into
    `out` (which may be `weight` itself: each block is read before it is written)."""
    from llmbuild.quant.quantize_layer import quantize_projection

    w = weight.numpy()
    out = torch.empty_like(weight) if out is None else out
    for lo in range(0, w.shape[0], ROW_BLOCK):
        block = quantize_projection(w[lo : lo + ROW_BLOCK], scheme).dequantize()
        out[lo : lo + ROW_BLOCK] = torch.from_numpy(block.astype(np.float32))
    return out


class RoundedProjections:
    """`inner` with the seven projections of every layer rounded to nearest."""

    def __init__(self, inner: ReferenceWeights, scheme: QuantScheme) -> None:
        self.inner, self.scheme, self.config = inner, scheme, inner.config
        self.levels = LevelsCache(levels_budget(self.config))

    def layer(self, i: int, keys: Sequence[str], out: Buffers | None = None) -> dict[str, torch.Tensor]:
        from llmbuild.quant.quantize_layer import quantize_projection

        # A projection whose levels are cached is not read again: its float weights only fed the rounding.
        kept = {f"{proj}.weight": self.levels.kept[f"{i}.{proj}"] for proj in QUANTIZED_PROJECTIONS
                if f"{i}.{proj}" in self.levels.kept and f"{proj}.weight" in keys}
        state = self.inner.layer(i, [k for k in keys if k not in kept], out)
        for name, ql in kept.items():
            state[name] = dequantize_rows(ql, out=buffer_for(out, name, (ql.out_features, ql.in_features)))
        fresh = [proj for proj in QUANTIZED_PROJECTIONS if f"{proj}.weight" in keys and f"{proj}.weight" not in kept]
        # Rounded once per layer (the levels are cached between passes while they fit): the projections of
        # a layer on the tile threads (numpy releases the GIL), then dequantized in place.
        rounded = tile_map(lambda proj: quantize_projection(state[f"{proj}.weight"].numpy(), self.scheme), fresh)
        for proj, ql in zip(fresh, rounded, strict=True):
            name = f"{proj}.weight"
            self.levels.put(f"{i}.{proj}", ql)
            state[name] = dequantize_rows(ql, out=state[name])
        return state

    def deltas(self, i: int) -> dict[str, LevelDeltas]:
        return {proj: ql for proj in QUANTIZED_PROJECTIONS
                if isinstance(ql := self.levels.kept.get(f"{i}.{proj}"), LevelDeltas)}

    def norm(self) -> torch.Tensor:
        return self.inner.norm()

    def embedding_rows(self, ids: Sequence[int]) -> torch.Tensor:
        return self.inner.embedding_rows(ids)

    def head_rows(self, lo: int, hi: int) -> torch.Tensor:
        return self.inner.head_rows(lo, hi)


class RoundedHead:
    """`inner` with lm_head rounded to nearest; with tied embeddings the embedding rows are that same
    rounded table (the compiled model stores the table once, quantized)."""

    def __init__(self, inner: ReferenceWeights, scheme: QuantScheme) -> None:
        self.inner, self.scheme, self.config = inner, scheme, inner.config

    def layer(self, i: int, keys: Sequence[str], out: Buffers | None = None) -> dict[str, torch.Tensor]:
        return self.inner.layer(i, keys, out)

    def deltas(self, i: int) -> dict[str, LevelDeltas]:
        return self.inner.deltas(i)

    def norm(self) -> torch.Tensor:
        return self.inner.norm()

    def embedding_rows(self, ids: Sequence[int]) -> torch.Tensor:
        rows = self.inner.embedding_rows(ids)
        return round_rows(rows, self.scheme) if _tied(self.config) else rows

    def head_rows(self, lo: int, hi: int) -> torch.Tensor:
        return round_rows(self.inner.head_rows(lo, hi), self.scheme)


def _tied(config: Any) -> bool:
    return bool(getattr(config, "tie_word_embeddings", False))

"""transformers' nn.Linear for a projection whose levels the reference keeps (LevelDeltas), to the bit.

Once a layer's levels are cached, remaking its float32 weights for every pass of greedy generation wrote
and read the whole layer through memory each token (a 1.5B model: 5.2 GB of float32 written by the
dequantization, then read by the products). A decode step multiplies one row, so `DeltaLinear` instead
dequantizes a block of weight rows that stays in the L2 cache and multiplies it at once: the same products
(each output is one dot product over the whole K, by the same matrix-vector code, on rows at the same
64-byte alignment), a sixth of the time. tests/test_delta_linear.py checks the bits against `F.linear` on
the whole dequantized weight at real models' shapes, on one and two threads (the real-size projections of
Qwen2-1.5B/7B and Llama-3-8B were also checked so, once).

Several rows (a prompt, the stage checks' forward pass) are one matrix product whose blocking over K
depends on N, so there the whole weight is dequantized, as before, into one scratch tensor that every
projection shares: the same call on the same values as nn.Linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llmbuild.verify.stream_weights import LevelDeltas, dequantize_rows

# Weight values a decode step dequantizes at a time: 1 MiB of float32, a quarter of this CPU's L2 (4 MiB
# for 2 cores). Blocks hold a multiple of 16 rows, so each block starts at the alignment its rows have in
# a whole 64-byte-aligned matrix whenever a row is a multiple of 4 bytes.
BLOCK_VALUES = 1 << 18
ROW_MULTIPLE = 16
# Blocked only where the projection's rows are a multiple of this (every real model's are): on two threads
# MKL splits a matrix-vector product of other row counts (300 rows of 3584) in a way the blocks do not
# reproduce. Otherwise the whole weight, as for several rows.
ROWS_ALIGNED = 64


class _Scratch:
    """One float32 buffer per process, grown to the largest weight asked for (torch's allocator aligns it
    to 64 bytes, as `stream_model.aligned` does the layers' weights)."""

    tensor = torch.empty(0)

    @classmethod
    def get(cls, values: int) -> torch.Tensor:
        if cls.tensor.numel() < values:
            cls.tensor = torch.empty(values, dtype=torch.float32)
        return cls.tensor[:values]


class DeltaLinear(nn.Module):
    """`y = x W^T + b` with W = (level - zero) * scale held as cached LevelDeltas (no float32 copy)."""

    def __init__(self, deltas: LevelDeltas, bias: bool) -> None:
        super().__init__()
        self.deltas = deltas
        self.out_features, self.in_features = deltas.out_features, deltas.in_features
        if bias:  # loaded with the layer's state dict (assign=True), as nn.Linear's would be
            self.bias = nn.Parameter(torch.empty(self.out_features, device="meta"))
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, k = self.out_features, self.in_features
        rows = x.reshape(-1, k)
        if rows.shape[0] != 1 or n % ROWS_ALIGNED or k % 4:
            weight = _Scratch.get(n * k).view(n, k)
            return F.linear(x, dequantize_rows(self.deltas, out=weight), self.bias)
        step = max(ROW_MULTIPLE, BLOCK_VALUES // k // ROW_MULTIPLE * ROW_MULTIPLE)
        scratch = _Scratch.get(min(step, n) * k)
        out = torch.empty(1, n, dtype=torch.float32)
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            block = self.deltas.rows_into(lo, hi, scratch[: (hi - lo) * k].view(hi - lo, k))
            bias = None if self.bias is None else self.bias[lo:hi]
            out[:, lo:hi] = F.linear(rows, block, bias)
        return out.reshape(*x.shape[:-1], n)


def swap_in(module: nn.Module, deltas: dict[str, LevelDeltas]) -> None:
    """Replace `module`'s nn.Linear submodules named in `deltas` (paths relative to `module`) with
    DeltaLinears over them; the biases are left for the state dict to fill."""
    for path, d in deltas.items():
        parent_path, _, name = path.rpartition(".")
        parent = module.get_submodule(parent_path) if parent_path else module
        linear = getattr(parent, name)
        if (linear.out_features, linear.in_features) != (d.out_features, d.in_features):
            raise RuntimeError(f"streamed reference: {path} is {linear.out_features} x {linear.in_features}, "
                               f"its cached levels {d.out_features} x {d.in_features}")
        setattr(parent, name, DeltaLinear(d, linear.bias is not None))

"""How a quantization mode stores weights and activations, in bytes, for the cost and memory models.

Float modes store every weight in the activation type. The w4/w8 modes store each linear weight [N, K]
as packed 4/8-bit values plus one scale (2 bytes, the activation type) and one zero point (1 byte) per
group of `group_size` weights along K: 0.5 + 3/g and 1 + 3/g bytes per weight, the incumbent's device
format (docs/design.md, "The cost model"). Norm weights, biases and the embedding table stay in the activation type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmbuild import LlmbuildError
from llmbuild.numerics.formats import itemsize
from llmbuild.recipe_types import DEFAULT_GROUP_SIZE, FLOAT_MODES, MODES

SCALE_BYTES = 2  # bf16/f16 scale per group
ZERO_BYTES = 1  # uint8 zero point per group
# Vector ops to turn one stored weight back into the activation type before the MAC array uses it:
# w4: unpack the nibble, convert, subtract the zero point, multiply by the scale; w8 needs no unpack.
DEQUANT_OPS = {4: 4, 8: 3}


@dataclass(frozen=True)
class WeightFormat:
    mode: str
    act_dtype: str  # f32, bf16 or f16: activations, norms, biases, embedding, KV cache
    weight_bits: int | None  # 4 or 8 for w4/w8 modes; None: weights in act_dtype
    group_size: int  # weights per scale/zero point along K; -1: one group per output channel

    @property
    def act_bytes(self) -> int:
        return itemsize(self.act_dtype)

    @property
    def quantized(self) -> bool:
        return self.weight_bits is not None

    def groups(self, k: int) -> int:
        return 1 if self.group_size == -1 else math.ceil(k / self.group_size)

    def matrix_tensors(self, n: int, k: int) -> list[tuple[str, int]]:
        """(suffix, bytes) of each tensor a linear weight [N, K] is stored as."""
        if self.weight_bits is None:
            return [("weight", n * k * self.act_bytes)]
        return [
            ("qweight", n * k * self.weight_bits // 8),
            ("scales", n * self.groups(k) * SCALE_BYTES),
            ("zeros", n * self.groups(k) * ZERO_BYTES),
        ]

    def matrix_bytes(self, n: int, k: int) -> int:
        return sum(size for _, size in self.matrix_tensors(n, k))

    @property
    def dequant_ops(self) -> int:
        return 0 if self.weight_bits is None else DEQUANT_OPS[self.weight_bits]

    def unquantized(self) -> WeightFormat:
        """The same activations with float weights (a head the schedule keeps unquantized)."""
        return WeightFormat(self.mode, self.act_dtype, None, self.group_size)


def weight_format(mode: str, group_size: int = DEFAULT_GROUP_SIZE) -> WeightFormat:
    if mode not in MODES:
        raise LlmbuildError(f"quantization mode {mode!r}: expected one of {', '.join(MODES)}")
    if not (group_size > 0 or group_size == -1):
        raise LlmbuildError(f"group size {group_size}: expected > 0, or -1 (per channel)")
    if mode in FLOAT_MODES:
        return WeightFormat(mode, mode, None, group_size)
    bits, act = int(mode[1]), mode[2:]  # "w4bf16" -> 4, "bf16"
    return WeightFormat(mode, act, bits, group_size)

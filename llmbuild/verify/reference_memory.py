"""The streamed reference's memory budgets, in one torch-free place: the reference reads them
(verify/stream_model.py, stream_weights.py) and so does the reference rule's declared memory
(build/resources.py), which must not import torch to schedule a job.
"""

from __future__ import annotations

# Decoder layers kept resident between passes (the first ones that fit): a layer is cheap to remake once its
# rounded levels are cached, and 128 MiB keeps the whole build's memory below TPU-MLIR's on SmolLM2.
LAYER_CACHE_BYTES = 128 << 20
# Quantized levels kept between passes (a pass streams every layer; greedy generation makes one pass per
# new token): unpacking a checkpoint's words, or rounding a float layer to nearest, costs several times the
# dequantization that follows it, and the levels are a byte a weight, a quarter of the layer in float32.
LEVELS_CACHE_BYTES = 3 << 29
# The cached levels and the float32 work of making one layer (the layer, its reads and the dequantization's
# buffers: 2.5 times its float32 size) share this: a 1.5B model's levels all stay (1.3 GB), a 7B or 8B
# keeps 0.5-0.6 GB of them, and its reference stays under 4 GiB (Llama-3-8B peaked at 4.45 GiB with
# 1.5 GiB of levels beside its 0.87 GB layers).
LEVELS_AND_LAYER_BYTES = 11 << 28


def levels_budget(layer_weights: int) -> int:
    """The levels cache's budget for a model with `layer_weights` weights in each decoder layer."""
    return max(0, min(LEVELS_CACHE_BYTES, LEVELS_AND_LAYER_BYTES - int(2.5 * 4 * layer_weights)))

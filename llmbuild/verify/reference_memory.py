"""The streamed reference's memory budgets, in one torch-free place: the reference reads them
(verify/stream_model.py, stream_weights.py) and so does the reference rule's declared memory
(build/resources.py), which must not import torch to schedule a job.
"""

from __future__ import annotations

# Decoder layers kept resident between passes (the first ones that fit): a layer is cheap to remake once its
# rounded levels are cached, and 128 MiB bounds the reference whatever the model.
LAYER_CACHE_BYTES = 128 << 20
# Unless every layer fits this: then all stay. A small model's reference is on its build's critical path, and
# remaking 21 of SmolLM2's 30 layers for each generated token (dequantizing them again from a GGUF file) was
# a sixth of its reference step (6.8 -> 5.8 s from GGUF, 6.0 -> 5.4 s from bf16 safetensors, for 270 MB more).
ALL_LAYERS_BYTES = 512 << 20
# Quantized levels kept between passes (a pass streams every layer; greedy generation makes one pass per
# new token): unpacking a checkpoint's words, or rounding a float layer to nearest, costs several times the
# dequantization that follows it, and the levels are a byte a weight, a quarter of the layer in float32.
LEVELS_CACHE_BYTES = 3 << 29
# The cached levels and the float32 work of making one layer (the layer, its reads and the dequantization's
# buffers: 2.5 times its float32 size) share this: a 1.5B model's levels all stay (1.3 GB), a 7B or 8B
# keeps 0.5-0.6 GB of them, and its reference stays under 4 GiB (Llama-3-8B peaked at 4.45 GiB with
# 1.5 GiB of levels beside its 0.87 GB layers).
LEVELS_AND_LAYER_BYTES = 11 << 28


def layer_cache_budget(all_layers_bytes: int) -> int:
    """The resident layers' budget for a model whose decoder layers take `all_layers_bytes` in float32."""
    return all_layers_bytes if all_layers_bytes <= ALL_LAYERS_BYTES else LAYER_CACHE_BYTES


def levels_budget(layer_weights: int) -> int:
    """The levels cache's budget for a model with `layer_weights` weights in each decoder layer."""
    return max(0, min(LEVELS_CACHE_BYTES, LEVELS_AND_LAYER_BYTES - int(2.5 * 4 * layer_weights)))

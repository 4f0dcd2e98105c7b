"""transformers' own causal LM, with its decoder layers materialised one at a time.

The model is instantiated on the `meta` device (no memory), then its parts that hold weights are swapped:
- each decoder layer becomes a `StreamedLayer` that, when called, copies the meta layer (transformers'
  own Qwen2/Qwen3/Llama decoder-layer class), gives it that layer's float32 tensors, runs it and drops it;
- the embedding becomes a gather of the rows of the tokens in the batch;
- lm_head computes its logits in blocks of vocabulary rows.
The final norm and the rotary embedding are materialised for real (they are tiny). Everything else is
transformers' code unchanged: the decoder's forward (positions, the causal mask, RoPE, the KV cache) and
`generate`, so streamed results are what the whole model gives, to the bit (tests/test_reference_stream.py).

Peak memory is one layer in float32 (the next layer is written into the last one's tensors), one block of
lm_head rows, the KV cache and the activations. Greedy generation streams every layer again for each new
token; `LayerStore` keeps the first layers that fit a budget resident: every layer of a small model
(up to 512 MiB of float32 layers: SmolLM2-135M), else 128 MiB of them (a 7B layer never fits).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from llmbuild.verify.delta_linear import swap_in
from llmbuild.verify.reference_memory import layer_cache_budget
from llmbuild.verify.stream_weights import ReferenceWeights

HEAD_ROW_BLOCK = 8192  # lm_head rows per block: 117 MB of float32 at hidden 3584
_ALIGN = 64  # bytes: torch's CPU allocator's alignment


def aligned(t: torch.Tensor) -> torch.Tensor:
    """`t` as contiguous float32 at a 64-byte aligned address (a copy only when it is not). MKL picks its
    one-row product's vector loops by the operands' alignment, so the last bits of a decode step depend on
    where a weight sits; aligning every weight makes them independent of where a file put a tensor
    (safetensors: 8-byte aligned, numpy: 16) and equal to a whole model holding them aligned."""
    t = t.to(torch.float32).contiguous()
    if t.data_ptr() % _ALIGN == 0:
        return t
    return torch.empty(t.shape, dtype=torch.float32).copy_(t)


class LayerStore:
    """Decoder layers made on demand from meta templates. Layers are always visited in order, so an LRU
    would evict each one just before its next use; instead the first layers that fit `budget_bytes` stay
    resident, which bounds memory whatever the number of layers. A streamed layer's tensors, once it has
    run, are the buffers the next layer is written into (no fresh pages to fault in and zero)."""

    def __init__(self, weights: ReferenceWeights, templates: Sequence[nn.Module], budget_bytes: int) -> None:
        self.weights, self.templates, self.budget = weights, list(templates), budget_bytes
        self.kept: dict[int, nn.Module] = {}
        self.kept_bytes = 0
        self.spare: dict[str, torch.Tensor] | None = None
        self.loads = self.reused = 0  # layers materialised, and tensors written into a spare buffer

    def run(self, i: int, args: tuple, kwargs: dict) -> Any:
        module = self.get(i)
        try:
            return module(*args, **kwargs)
        finally:
            # Not after the last layer: lm_head and the embedding run next, and would find a layer's worth
            # of buffers still held (the next pass's first layer pays for fresh pages instead).
            if i not in self.kept and i + 1 < len(self.templates):
                self.spare = dict(module.state_dict())

    def get(self, i: int) -> nn.Module:
        if i in self.kept:
            return self.kept[i]
        template = self.templates[i]
        spare, self.spare = self.spare, None
        module = copy.deepcopy(template)
        # Projections whose levels the weights keep run from them (delta_linear.py): no float32 copy.
        deltas = self.weights.deltas(i)
        swap_in(module, deltas)
        keys = [k for k in template.state_dict() if k.removesuffix(".weight") not in deltas]
        state = {k: aligned(t) for k, t in self.weights.layer(i, keys, spare).items()}
        if spare:
            ours = {t.data_ptr() for t in spare.values()}
            self.reused += sum(t.data_ptr() in ours for t in state.values())
        del spare
        # assign=True: the state dict's tensors become the parameters (no second copy of the layer).
        module.load_state_dict(state, strict=True, assign=True)
        module.eval()
        self.loads += 1
        size = sum(p.numel() * p.element_size() for p in module.parameters())
        if self.kept_bytes + size <= self.budget:
            self.kept[i] = module
            self.kept_bytes += size
        return module


class StreamedLayer(nn.Module):
    """Stands in for decoder layer `index`: same call, materialised only while it runs."""

    def __init__(self, index: int, store: LayerStore) -> None:
        super().__init__()
        self.index = index
        self._store = [store]  # a list: not a registered submodule, so no meta parameters show

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._store[0].run(self.index, args, kwargs)


class EmbeddingRows(nn.Module):
    """nn.Embedding's forward from the rows of the ids in the batch only."""

    def __init__(self, weights: ReferenceWeights) -> None:
        super().__init__()
        self._weights = [weights]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        unique, inverse = torch.unique(input_ids, return_inverse=True)
        rows = self._weights[0].embedding_rows([int(i) for i in unique])
        return rows[inverse]


class HeadRows(nn.Module):
    """lm_head (a bias-free nn.Linear) computed HEAD_ROW_BLOCK vocabulary rows at a time. Each logit is one
    dot product over the hidden size whichever block it is in, and BLAS gives the same bits for a block of
    rows as for the whole matrix (measured: tests/test_reference_stream.py compares with transformers)."""

    def __init__(self, weights: ReferenceWeights, vocab: int) -> None:
        super().__init__()
        self._weights, self.vocab = [weights], vocab

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = torch.empty(*hidden.shape[:-1], self.vocab, dtype=torch.float32)
        for lo in range(0, self.vocab, HEAD_ROW_BLOCK):
            hi = min(lo + HEAD_ROW_BLOCK, self.vocab)
            out[..., lo:hi] = nn.functional.linear(hidden, aligned(self._weights[0].head_rows(lo, hi)))
        return out


def streamed_model(weights: ReferenceWeights, cache_bytes: int | None = None) -> tuple[Any, LayerStore]:
    """(transformers' causal LM for `weights.config` in float32, its layer store). Call it and `generate`
    it like any transformers model, under torch.no_grad(). `cache_bytes`: the resident layers' budget
    (default: reference_memory.layer_cache_budget)."""
    import transformers

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(weights.config, dtype=torch.float32)
    decoder = model.get_decoder()
    if cache_bytes is None:
        cache_bytes = layer_cache_budget(sum(4 * p.numel() for p in decoder.layers.parameters()))
    store = LayerStore(weights, list(decoder.layers), cache_bytes)
    decoder.layers = nn.ModuleList(StreamedLayer(i, store) for i in range(len(decoder.layers)))
    decoder.embed_tokens = EmbeddingRows(weights)
    model.lm_head = HeadRows(weights, model.config.vocab_size)
    decoder.norm.to_empty(device="cpu")
    decoder.norm.load_state_dict({"weight": aligned(weights.norm())}, strict=True)
    # Built on the CPU from the config, as transformers builds it (its inverse frequencies are buffers).
    decoder.rotary_emb = type(decoder.rotary_emb)(config=model.config)
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:  # an architecture with a weight-holding part this module does not know
        raise RuntimeError(f"streamed reference: {left[0]} was not materialised")
    return model.eval(), store

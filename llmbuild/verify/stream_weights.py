"""Where the streamed reference's float32 weights come from, one decoder layer (or a few rows) at a time.

Every source serves the same `ReferenceWeights` interface: transformers' config (no quantization_config),
one decoder layer's state dict (names relative to the layer, as its module expects them), the final norm,
embedding rows of given token ids and row ranges of lm_head (the embedding table when tied). Nothing here
ever holds a whole model, nor a whole embedding or lm_head in float32.

Readers, chosen for independence from the compiler's own import path where one exists:
- HF float checkpoints (synthetic, `hf`): the safetensors library itself, as transformers reads them;
- quantized checkpoints: llmbuild.quant's dequantization (checked bit for bit against each writing
  library in tests/test_quant_formats.py), float tensors again through safetensors;
- GGUF: llmbuild's GGUF reader, checked against transformers' own GGUF loader (tensors and config) in
  tests/test_reference_stream.py.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from llmbuild import LlmbuildError
from llmbuild.verify import reference_memory

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Rows of a projection dequantized or rounded at a time: the f32 temporaries of a 7B down_proj
# (3584 x 18944) would otherwise be a few hundred MB each.
ROW_BLOCK = 1024
DELTA_BLOCK = 1 << 18  # values of a LevelDeltas dequantized at a time: a block stays in the L2 cache
# The previous layer's tensors, by key, for the next layer to be written into: a new 7B layer is 0.93 GB
# of fresh pages, and the kernel's zeroing of them took a third of the reference's time (300 s of
# system time, 147M page faults, for one 7B reference).
Buffers = Mapping[str, torch.Tensor]


class ReferenceWeights(Protocol):
    config: Any  # a transformers PretrainedConfig

    def layer(self, i: int, keys: Sequence[str], out: Buffers | None = None) -> dict[str, torch.Tensor]:
        """Decoder layer i's tensors named `keys` (relative to the layer), float32, written into `out`'s
        tensor of the same key where it has one of the same shape."""
        ...

    def deltas(self, i: int) -> dict[str, LevelDeltas]:
        """Layer i's projections (paths relative to the layer) whose levels are cached as LevelDeltas: the
        streamed model runs those from the levels and does not ask `layer` for their weights."""
        ...

    def norm(self) -> torch.Tensor: ...

    def embedding_rows(self, ids: Sequence[int]) -> torch.Tensor:
        """[len(ids), hidden] float32."""
        ...

    def head_rows(self, lo: int, hi: int) -> torch.Tensor:
        """lm_head rows lo..hi, [hi - lo, hidden] float32."""
        ...


class SafetensorsTables:
    """Float tensors of a HF checkpoint directory read by the safetensors library: whole, as a row range or
    as gathered rows, widened to float32 (exact for bf16/f16). Each read opens and closes its file: a
    mapping kept open would count every page read so far in the process's resident memory (the whole
    checkpoint by the end), although the kernel could drop them."""

    def __init__(self, directory: Path) -> None:
        from safetensors import safe_open

        self.directory = Path(directory)
        index, single = self.directory / INDEX_FILE, self.directory / SINGLE_FILE
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
            if not isinstance(weight_map, dict):
                raise LlmbuildError(f"{index}: missing field 'weight_map'")
            files = {name: self.directory / shard for name, shard in weight_map.items()}
        elif single.is_file():
            with safe_open(str(single), framework="pt") as f:
                files = dict.fromkeys(f.keys(), single)
        else:
            raise LlmbuildError(f"{self.directory}: no {SINGLE_FILE} or {INDEX_FILE}")
        self._files: dict[str, Path] = files
        # A vision-language checkpoint's language model under the names transformers' text model reads.
        from llmbuild.frontend.hf import canonical_name

        self._keys: dict[str, str] = {}
        for key in files:
            name = canonical_name(key)
            name = name if name.startswith("lm_head.") else "model." + name
            if name != key and name not in files:
                self._keys[name] = key
        for name, key in self._keys.items():
            self._files[name] = files[key]

    def __contains__(self, name: object) -> bool:
        return name in self._files

    def _read(self, name: str, take: Callable[[Any], torch.Tensor], convert: bool = True) -> torch.Tensor:
        from safetensors import safe_open

        file = self._files.get(name)
        if file is None:
            raise LlmbuildError(f"{self.directory}: missing tensor {name!r} for the reference model")
        with safe_open(str(file), framework="pt") as f:
            part = f.get_slice(self._keys.get(name, name))
            if not part.get_dtype().startswith(("F", "BF")):
                raise LlmbuildError(f"{file}: tensor {name!r} has dtype {part.get_dtype()}, expected a float")
            value = take(part)
            return value.to(torch.float32).contiguous() if convert else value

    def tensor(self, name: str) -> torch.Tensor:
        return self._read(name, lambda part: part[:])

    def stored(self, name: str) -> torch.Tensor:
        """The tensor in its stored float dtype (placed into a buffer, it is converted there)."""
        return self._read(name, lambda part: part[:], convert=False)

    def rows(self, name: str, lo: int, hi: int) -> torch.Tensor:
        return self._read(name, lambda part: part[lo:hi])

    def gather(self, name: str, ids: Sequence[int]) -> torch.Tensor:
        return self._read(name, lambda part: torch.cat([part[i : i + 1] for i in ids]))


def place(value: torch.Tensor, out: Buffers | None, key: str) -> torch.Tensor:
    """`value` as float32, converted into out[key] when that buffer exists with its shape."""
    buffer = None if out is None else out.get(key)
    if buffer is None or buffer.shape != value.shape:
        return value.to(torch.float32)
    return buffer.copy_(value)


def buffer_for(out: Buffers | None, key: str, shape: tuple[int, ...]) -> torch.Tensor:
    """out[key] when it has `shape`, else a new float32 tensor."""
    buffer = None if out is None else out.get(key)
    return buffer if buffer is not None and tuple(buffer.shape) == shape else torch.empty(shape)


def _check_ids(ids: Sequence[int], vocab: int) -> None:
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise LlmbuildError(f"reference: token id {bad[0]} is outside the vocabulary of {vocab}")


class HFWeights:
    """A float HF checkpoint directory (synthetic or `hf` sources): transformers' names under `model.`."""

    def __init__(self, directory: Path) -> None:
        self.config = text_model_config(Path(directory))
        self.tables = SafetensorsTables(Path(directory))

    def layer(self, i: int, keys: Sequence[str], out: Buffers | None = None) -> dict[str, torch.Tensor]:
        return {key: place(self.tables.stored(f"model.layers.{i}.{key}"), out, key) for key in keys}

    def deltas(self, i: int) -> dict[str, LevelDeltas]:
        return {}  # float weights: no levels

    def norm(self) -> torch.Tensor:
        return self.tables.tensor("model.norm.weight")

    def embedding_rows(self, ids: Sequence[int]) -> torch.Tensor:
        _check_ids(ids, self.config.vocab_size)
        return self.tables.gather("model.embed_tokens.weight", ids)

    def head_rows(self, lo: int, hi: int) -> torch.Tensor:
        # transformers ties lm_head to the embedding whenever the config says so, whatever the file holds.
        name = "model.embed_tokens.weight" if self.config.tie_word_embeddings else "lm_head.weight"
        return self.tables.rows(name, lo, hi)


def text_model_config(directory: Path) -> Any:
    """transformers' config of the directory's language model: a vision-language checkpoint's is its text
    part (its family's `text_config`, whichever layout it is saved in; the vit net is checked apart)."""
    import transformers

    from llmbuild.frontend.hf import read_json, text_config

    fields = read_json(directory / "config.json")
    text = text_config(fields)
    if text is not fields:  # a vision-language config (some, MiniCPM-V's, have no transformers class)
        return transformers.AutoConfig.for_model(**text)
    return transformers.AutoConfig.from_pretrained(directory, local_files_only=True)


class QuantizedWeights(HFWeights):
    """A quantized checkpoint (imported, or written by the quantize step): every layer the checkpoint
    quantizes is its dequantized levels (llmbuild.quant), every other tensor as stored. The config drops
    quantization_config so transformers builds the float model those weights mean."""

    def __init__(self, directory: Path) -> None:
        import transformers

        from llmbuild.quant.checkpoint import QuantizedCheckpoint

        self.directory = Path(directory)
        self.quantized = set(QuantizedCheckpoint(self.directory).linear_prefixes())
        fields = json.loads((self.directory / "config.json").read_text(encoding="utf-8"))
        fields.pop("quantization_config", None)
        self.config = transformers.AutoConfig.for_model(**fields)
        self.tables = SafetensorsTables(self.directory)
        self.levels = LevelsCache(levels_budget(self.config))

    def deltas(self, i: int) -> dict[str, LevelDeltas]:
        prefix = f"model.layers.{i}."
        return {name.removeprefix(prefix): ql for name in sorted(self.quantized) if name.startswith(prefix)
                and isinstance(ql := self.levels.kept.get(name), LevelDeltas)}

    def layer(self, i: int, keys: Sequence[str], out: Buffers | None = None) -> dict[str, torch.Tensor]:
        from llmbuild.quant.checkpoint import QuantizedCheckpoint

        # A fresh reader per layer: it memory-maps the files, and its maps (with every page read through
        # them counted as resident) go when it does.
        checkpoint = QuantizedCheckpoint(self.directory)
        state = {}
        for key in keys:
            name = f"model.layers.{i}.{key}"
            prefix = name.removesuffix(".weight")
            if name.endswith(".weight") and prefix in self.quantized:
                ql = self.levels.get(prefix, lambda p=prefix: checkpoint.linear(p))
                state[key] = dequantize_rows(ql, buffer_for(out, key, (ql.out_features, ql.in_features)))
            else:
                state[key] = place(self.tables.stored(name), out, key)
        return state


def levels_budget(config: Any) -> int:
    """The levels cache's budget for a model of this transformers config (reference_memory.py)."""
    hidden, heads = config.hidden_size, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    layer = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * config.intermediate_size
    return reference_memory.levels_budget(layer)


class LevelDeltas:
    """A cached QuantizedLinear with contiguous groups, as the exact integers its dequantization multiplies:
    level - zero point in int8 (4-bit: -16..15; 8-bit with zero point 128: -128..127) beside the float32
    scales. A pass over the layers then dequantizes with one widening copy and one multiply: the
    subtraction was a third of each generated token's 1.5 s on the 1.5B reference. Same bits: q - zero is
    exact either way and the multiply is the one rounding."""

    def __init__(self, delta: np.ndarray, scale: np.ndarray, group_size: int) -> None:
        self.delta, self.scale, self.group_size = delta, scale, group_size
        self.out_features, self.in_features = delta.shape

    @staticmethod
    def of(ql: Any) -> Any:
        """`ql` as LevelDeltas when its groups are contiguous and level - zero point fits int8; else `ql`."""
        zero = np.asarray(ql.zero, dtype=np.float32)
        if ql.g_idx is not None or not np.array_equal(zero, np.round(zero)):
            return ql
        g = ql.group_size
        n, k = ql.q.shape
        q = np.asarray(ql.q)
        if q.dtype == np.uint8 and zero.size and zero.min() >= 0 and zero.max() <= 127 and q.max() <= 127:
            # 4-bit levels and zero points: q - zero is in [-127, 127], computed in int8 directly (a third
            # of the time of going through int16)
            delta8 = q.view(np.int8).reshape(n, k // g, g) - zero.astype(np.int8)[:, :, None]
            return LevelDeltas(delta8.reshape(n, k), np.asarray(ql.scale, dtype=np.float32), g)
        delta = q.reshape(n, k // g, g).astype(np.int16)
        delta -= zero.astype(np.int16)[:, :, None]
        if delta.min(initial=0) < -128 or delta.max(initial=0) > 127:
            return ql
        return LevelDeltas(delta.astype(np.int8).reshape(n, k), np.asarray(ql.scale, dtype=np.float32), g)

    @property
    def nbytes(self) -> int:
        return self.delta.nbytes + self.scale.nbytes

    def rows_into(self, lo: int, hi: int, out: torch.Tensor) -> torch.Tensor:
        """Rows lo:hi dequantized into `out` ([hi - lo, K] float32): (level - zero) * scale, one rounding."""
        out.copy_(torch.from_numpy(self.delta[lo:hi]))  # int8 -> float32, exact
        out.view(hi - lo, -1, self.group_size).mul_(torch.from_numpy(self.scale[lo:hi])[:, :, None])
        return out


class LevelsCache:
    """QuantizedLinears by name (as LevelDeltas where they can be), kept while they fit a fixed budget (the
    first ones made: layers are visited in order, so an LRU would evict each just before its reuse);
    memory stays bounded whatever the model."""

    def __init__(self, budget_bytes: int = reference_memory.LEVELS_CACHE_BYTES) -> None:
        self.budget, self.used = budget_bytes, 0
        self.kept: dict[str, Any] = {}

    def get(self, name: str, make: Callable[[], Any]) -> Any:
        ql = self.kept.get(name)
        if ql is None:
            ql = make()
            self.put(name, ql)
        return ql

    def put(self, name: str, ql: Any) -> None:
        size = ql.q.nbytes + np.asarray(ql.scale).nbytes + np.asarray(ql.zero).nbytes
        if name not in self.kept and self.used + size <= self.budget:
            kept = LevelDeltas.of(ql)
            self.kept[name] = kept
            self.used += kept.nbytes if isinstance(kept, LevelDeltas) else size


def dequantize_rows(ql: Any, out: torch.Tensor | None = None) -> torch.Tensor:
    """QuantizedLinear.dequantize(), the same bits (tests/test_reference_stream.py), ROW_BLOCK output rows
    at a time into one float32 tensor (no whole-matrix f32 temporaries) and with torch's vectorised ops:
    numpy's per-element gathers of scales and zero points took 6 s per 7B layer, paid again for every
    generated token. Each element is still (q - zero) * scale in float32 with q - zero an exact small
    integer, so there is one rounding whatever the order; contiguous groups (no act order) broadcast
    their scale and zero point instead of gathering them. `ql` may be a cache's LevelDeltas."""
    n, k, g = ql.out_features, ql.in_features, ql.group_size
    out = torch.empty(n, k, dtype=torch.float32) if out is None else out
    if isinstance(ql, LevelDeltas):
        step = max(1, DELTA_BLOCK // k)
        for lo in range(0, n, step):
            ql.rows_into(lo, min(lo + step, n), out[lo : lo + step])
        return out
    index = None if ql.g_idx is None else torch.from_numpy(ql.group_index().astype(np.int64))
    for lo in range(0, n, ROW_BLOCK):
        hi = min(lo + ROW_BLOCK, n)
        zero = torch.from_numpy(np.asarray(ql.zero[lo:hi], dtype=np.float32))
        scale = torch.from_numpy(np.asarray(ql.scale[lo:hi], dtype=np.float32))
        rows = out[lo:hi]
        # The uint8 levels widened to float32 (exact) in place first: a subtraction that promotes its uint8
        # operand takes torch's slow mixed-type path, 6.5 s of the 1.5B reference's 34 s.
        rows.copy_(torch.from_numpy(ql.q[lo:hi]))
        if index is None:
            grouped = rows.view(hi - lo, k // g, g)
            grouped.sub_(zero[:, :, None])
            grouped.mul_(scale[:, :, None])
        else:
            rows.sub_(zero[:, index])
            rows.mul_(scale[:, index])
    return out


class GGUFWeights:
    """A GGUF file through llmbuild's GGUF reader (dequantized, q/k row permutation undone); the config is
    the one the build exports for the file (frontend/export_hf.py). Both are compared with transformers'
    own GGUF loader in tests/test_reference_stream.py; this reader takes a fraction of its time."""

    def __init__(self, path: Path) -> None:
        import transformers

        from llmbuild.frontend.export_hf import hf_config_from_spec
        from llmbuild.frontend.gguf_source import GGUFSource, canonical_gguf_name, open_gguf

        self.source = GGUFSource(Path(path))
        self.config = transformers.AutoConfig.for_model(**hf_config_from_spec(self.source.spec))
        index, _ = open_gguf(Path(path))
        self._raw = {canonical_gguf_name(t.name): t for t in index.tensors}

    def deltas(self, i: int) -> dict[str, LevelDeltas]:
        return {}  # dequantized by llama.cpp's formats as read, no levels kept

    def layer(self, i: int, keys: Sequence[str], out: Buffers | None = None) -> dict[str, torch.Tensor]:
        state = {}
        for key in keys:
            name = f"layers.{i}.{key}"
            # Dequantized straight into the last layer's buffer when there is one (no second copy).
            state[key] = buffer_for(out, key, self.source.shape(name))
            self.source.tensor(name, state[key].numpy())
        self._release()
        return state

    def norm(self) -> torch.Tensor:
        return torch.from_numpy(self.source.tensor("norm.weight"))

    def _rows(self, name: str, rows: Any) -> torch.Tensor:
        # Rows of the embedding and lm_head only: their GGUF rows are never permuted (only q/k are).
        from llmbuild.frontend.gguf_dequant import dequantize

        t = self._raw.get(name)
        if t is None:
            raise LlmbuildError(f"{self.source.path}: missing tensor for {name!r}")
        raw = np.asarray(t.data[rows])
        width = int(t.shape[-1])
        out = torch.empty((*raw.shape[:-1], width), dtype=torch.float32)  # torch-allocated: aligned (see aligned())
        dequantize(raw, t.tensor_type, out.numpy())
        self._release()
        return out

    def _release(self) -> None:
        """The GGUF reader keeps the whole file mapped for the process; every page read through the map
        counts as resident memory until we tell the kernel we are done with it (it stays in the page cache,
        and is simply mapped again on the next read)."""
        base: Any = next(iter(self._raw.values())).data
        while isinstance(base, np.ndarray):
            base = base.base
        if isinstance(base, memoryview):  # np.frombuffer's view of the map
            base = base.obj
        if isinstance(base, mmap.mmap):
            base.madvise(mmap.MADV_DONTNEED)

    def embedding_rows(self, ids: Sequence[int]) -> torch.Tensor:
        _check_ids(ids, self.config.vocab_size)
        return self._rows("embed_tokens.weight", np.asarray(ids, dtype=np.int64))

    def head_rows(self, lo: int, hi: int) -> torch.Tensor:
        name = "embed_tokens.weight" if self.config.tie_word_embeddings else "lm_head.weight"
        return self._rows(name, slice(lo, hi))

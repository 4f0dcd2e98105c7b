"""GGUF files (llama.cpp's format): metadata becomes the spec, tensors are dequantized one at a time.

Two things differ from a HF checkpoint besides names: GGUF lists dimensions fastest-first (the
reader's `tensor.data` is already in numpy order, [out, in] for a linear), and llama.cpp permutes
the q/k rows of `llama` files, which the architecture's `transform_gguf_tensor` undoes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.families.layout import expected_shapes
from llmbuild.families.registry import family_for_gguf, get_family
from llmbuild.families.spec import ModelSpec

_GLOBAL_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def canonical_gguf_name(gguf_name: str) -> str | None:
    """The canonical name of a GGUF tensor, or None if it has none."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        return None
    return f"layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"


def open_gguf(path: Path) -> tuple[Any, dict[str, Any]]:
    """(gguf.GGUFReader, metadata as plain Python values). Parsing the metadata of a 49k-token
    vocabulary takes seconds, so the last file opened is kept for the next caller."""
    path = Path(path).resolve()
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise LlmbuildError(f"{path}: GGUF file not found") from None
    return _open_gguf(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=1)
def _open_gguf(path: str, mtime_ns: int, size: int) -> tuple[Any, dict[str, Any]]:
    # gguf.GGUFReader takes 4-13 s on a 49k-token vocabulary, paid by every per-layer job; this
    # header reader gives the same metadata and tensor views in ~0.2 s (tests/test_frontend_gguf.py).
    from llmbuild.frontend.gguf_index import read_gguf

    metadata, tensors = read_gguf(Path(path))
    return _TensorIndex(list(tensors.values())), metadata


class _TensorIndex:
    """What GGUFSource uses of a GGUFReader: its list of tensors."""

    def __init__(self, tensors: list) -> None:
        self.tensors = tensors


class GGUFSource:
    """A TensorSource over a (possibly quantized) GGUF file, kept memory-mapped."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._reader, self.metadata = open_gguf(self.path)
        arch_name = self.metadata.get("general.architecture")
        if not isinstance(arch_name, str):
            raise LlmbuildError(f"{self.path}: missing metadata general.architecture")
        self.architecture = get_family(family_for_gguf(arch_name))
        self._tensors: dict[str, Any] = {}
        for t in self._reader.tensors:
            name = canonical_gguf_name(t.name)
            if name is None:
                # e.g. rope_freqs.weight (llama3 rope scaling): ignoring it would change the model.
                raise LlmbuildError(f"{self.path}: tensor {t.name!r} is not supported for {arch_name}")
            self._tensors[name] = t
        self.spec: ModelSpec = self.architecture.spec_from_gguf(
            self.metadata, [t.name for t in self._reader.tensors], origin=str(self.path)
        )
        self._shapes = expected_shapes(self.spec)

    def names(self) -> list[str]:
        return [name for name in self._shapes if name in self._tensors]

    def check_entries(self) -> None:
        """Every tensor the architecture needs present with its shape, from the index alone (prepare)."""
        for name in self._shapes:
            self._entry(name)

    def _entry(self, name: str) -> Any:
        """The file's tensor for canonical `name`, present and of the shape the metadata implies."""
        expected = self._shapes.get(name)
        if expected is None:
            raise LlmbuildError(f"{self.path}: {name!r} is not a tensor of this {self.spec.architecture} model")
        t = self._tensors.get(name)
        if t is None:
            raise LlmbuildError(f"{self.path}: missing tensor for {name!r}")
        if tuple(t.shape) != tuple(expected):
            raise LlmbuildError(f"{self.path}: tensor {t.name!r} has shape {list(t.shape)}, expected {list(expected)}")
        return t

    def shape(self, name: str) -> tuple[int, ...]:
        """Canonical tensor `name`'s shape (numpy order), checked against the file's entry."""
        return tuple(int(n) for n in self._entry(name).shape)

    def raw_tensors(self) -> list[Any]:
        """Every tensor of the file as stored (`gguf_index.GGUFTensor`: GGUF name, type, raw bytes)."""
        return list(self._tensors.values())

    def tensor_type(self, name: str) -> Any:
        """Canonical tensor `name`'s GGML type (from the index alone)."""
        return self._entry(name).tensor_type

    def stored(self, name: str) -> tuple[np.ndarray, Any, tuple[int, ...]]:
        """Canonical tensor `name` as stored: its raw blocks (rows in the canonical order), its GGML type and
        its numpy shape. The architecture's transform only reorders rows, and a quantized row is whole
        blocks: the stored rows are reordered, a fraction of the float32 bytes."""
        t = self._entry(name)
        raw = self.architecture.transform_gguf_tensor(name, np.asarray(t.data), self.spec)
        return raw, t.tensor_type, tuple(int(n) for n in t.shape)

    def tensor(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """Canonical tensor `name` in float32, new or written into `out` (float32, C-contiguous)."""
        from llmbuild.frontend.gguf_dequant import dequantize

        # Dequantized straight into the result, which the caller owns (an F32 tensor is otherwise a view
        # into the read-only map).
        raw, kind, shape = self.stored(name)
        out = np.empty(shape, dtype=np.float32) if out is None else out
        try:
            return dequantize(raw, kind, out)
        except NotImplementedError as exc:
            raise LlmbuildError(f"{self.path}: tensor {self._entry(name).name!r}: {exc}") from None


def gguf_metadata(path: Path) -> Mapping[str, Any]:
    return open_gguf(path)[1]

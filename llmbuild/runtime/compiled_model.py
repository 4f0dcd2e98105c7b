"""Loads a deployable binary and runs its nets: the runtime loop of the chip.

First chunk: `embedding` -> every `block_i` -> copy each layer's new k/v rows into its cache -> `lm_head`.
Later chunks of a long prompt (and later turns): `block_kv_i` on top of the cached history.
Each generated token: `embedding_cache` -> every `block_cache_i` -> the new k/v row written in place at
the current position -> `lm_head`.

A linear-attention layer (a hybrid model's, families/qwen3_5/) keeps a fixed-size state where a full layer
keeps its KV cache: its stages read the state in place and give the new rows of the convolution's input
(`present_conv`, whose last K - 1 real rows become the window) and the new recurrent matrix
(`present_recurrent`, copied over the old one). Such a state cannot be taken back to an earlier token:
`truncate` to fewer rows than the history starts the model over (the caller prefills again).

The loop is the same on both executors: the simulated device (`faithful=True`, every value through
global memory at its address: the verification path) and the host path (`runtime/host.py`: the same
programs on numpy arrays, bit-identical and much faster).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from llmbuild import LlmbuildError, one_line
from llmbuild.binary import program as programs
from llmbuild.binary.container import Container
from llmbuild.binary.memory_map import MemoryPlan, Slot
from llmbuild.binary.program import Program, TensorDesc
from llmbuild.binary.validate import validate_program
from llmbuild.numerics import masks
from llmbuild.runtime import blas
from llmbuild.runtime.device import Device
from llmbuild.runtime.host import HostExecutor
from llmbuild.runtime.weight_image import FileImage


class Executor(Protocol):
    """What the runtime loop needs from an executor (`Device` or `HostExecutor`)."""

    def set_input(self, prog: Program, name: str, value: np.ndarray) -> None: ...
    def run(self, prog: Program) -> None: ...
    def get_output(self, prog: Program, name: str) -> np.ndarray: ...
    def copy_rows(self, src: TensorDesc, dst: TensorDesc, at: int, rows: int) -> None: ...
    def shift_rows(self, src: TensorDesc, dst: TensorDesc, rows: int) -> None: ...
    def clear(self, dst: TensorDesc) -> None: ...
    def read(self, t: TensorDesc) -> Any: ...
    def set_output(self, prog: Program, name: str, value: np.ndarray) -> None: ...


class _Programs(dict):
    """Net name -> Program, each decoded when first asked for: a 28-layer binary holds 87 programs, and
    a conversation that never sends a second chunk never runs the prefill_kv ones."""

    def __init__(self, container: Container, sections: dict[str, str], memory_bytes: int, commands: bool):
        """`commands`: whether the programs' device commands are read (the simulated device runs them; the
        host path runs the op list alone)."""
        super().__init__()
        self._container, self._sections, self._memory = container, sections, memory_bytes
        self._commands = commands

    def __missing__(self, net: str) -> Program:
        if net not in self._sections:
            raise KeyError(net)
        section = self._sections[net]
        try:
            prog = programs.decode(self._container.section(section), self._commands)
            validate_program(prog, self._memory)
        except LlmbuildError as exc:
            raise LlmbuildError(f"{self._container.path}: section {section}: {exc}") from None
        self[net] = prog
        return prog

    def section(self, net: str) -> str:
        return self._sections[net]

    def __contains__(self, net: object) -> bool:
        return net in self._sections

    def __iter__(self):  # type: ignore[override]
        return iter(self._sections)

    def __len__(self) -> int:
        return len(self._sections)


META_FIELDS = {"spec": dict, "seq_length": int, "prefill_length": int, "nets": list, "memory": dict, "chip": str}


def read_meta(container: Container) -> dict[str, Any]:
    """The `meta` section, checked for the fields and types the runtime reads."""
    where = f"{container.path}: section meta"
    try:
        meta = json.loads(bytes(container.section("meta")))
    except (ValueError, UnicodeDecodeError) as exc:
        raise LlmbuildError(f"{where}: not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise LlmbuildError(f"{where}: expected a JSON object")
    for key, kind in META_FIELDS.items():
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise LlmbuildError(f"{where}: field {key}: expected {kind.__name__}, got {type(meta.get(key)).__name__}")
    ok_nets = all(isinstance(n, dict) and isinstance(n.get("name"), str) and isinstance(n.get("section"), str)
                  for n in meta["nets"])
    total = meta["memory"].get("total_bytes")
    if not ok_nets or not isinstance(total, int) or not 0 < total <= 1 << 40:
        raise LlmbuildError(f"{where}: fields nets (name and section strings) or memory.total_bytes are not valid")
    if not isinstance(meta["spec"].get("num_layers"), int) or not 0 < meta["spec"]["num_layers"] <= 1024:
        raise LlmbuildError(f"{where}: field spec.num_layers: expected 1..1024, got {meta['spec'].get('num_layers')!r}")
    if not 0 < meta["prefill_length"] <= meta["seq_length"] <= 1 << 20:
        raise LlmbuildError(f"{where}: fields prefill_length and seq_length are not 0 < L <= S <= 2^20")
    layers = meta["spec"]["num_layers"]
    expected = {"embedding", "embedding_cache", "lm_head"} | {
        f"{kind}_{i}" for i in range(layers) for kind in ("block", "block_kv", "block_cache")}
    names = [n["name"] for n in meta["nets"]]
    if sorted(names) != sorted(expected):
        raise LlmbuildError(f"{where}: field nets: expected the {len(expected)} nets of {layers} layers, once each")
    absent = [n["section"] for n in meta["nets"] if n["section"] not in container.entries]
    if absent:
        raise LlmbuildError(f"{where}: field nets: section {absent[0]!r} is not in the file")
    return meta


class CacheFullError(LlmbuildError):
    """The KV cache cannot take the tokens asked for (a conversation reached the capacity S)."""


# What running a validated program can still raise when the binary's writer was buggy or hostile (an
# attribute a kernel cannot honour, outputs renamed, a plan whose shapes disagree with the programs).
BINARY_FAULTS = (IndexError, KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError, MemoryError,
                 NotImplementedError, AttributeError)


def _quiet(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """Overflow to inf and underflow to 0 are the f32 arithmetic the chip does, not errors (silu's exp,
    masked softmax); one errstate per chunk or token, which costs less than one per net. A fault of the
    binary that only shows while it runs is one LlmbuildError naming the file."""

    @functools.wraps(fn)
    def run(model: CompiledModel, *args: Any) -> np.ndarray:
        with np.errstate(over="ignore", under="ignore"):
            try:
                return fn(model, *args)
            except BINARY_FAULTS as exc:
                raise LlmbuildError(f"{model.path}: the binary's programs and plan do not fit together "
                                    f"({type(exc).__name__}: {one_line(str(exc))})") from None

    return run


def _desc(slot: Slot) -> TensorDesc:
    return TensorDesc(slot.dtype, tuple(slot.shape), slot.address)


@dataclass
class StageCounts:
    prefill: int = 0
    prefill_kv: int = 0
    decode: int = 0


class CompiledModel:
    """One binary on one executor, with its KV cache."""

    def __init__(self, path: Path, faithful: bool = True, cache_bytes: int | None = None):
        """`cache_bytes`: decoded weights the host path keeps (default: runtime/host.py's budget)."""
        blas.warn_if_unpinned()
        self.path = Path(path)
        self.faithful = faithful
        self.container = Container(self.path)
        self.meta = read_meta(self.container)
        try:
            self.plan = MemoryPlan.from_json(bytes(self.container.section("plan")).decode())
            self.num_layers = int(self.meta["spec"]["num_layers"])
            self.S = int(self.meta["seq_length"])
            self.L = int(self.meta["prefill_length"])
            # Each layer's cache (k, v) or linear-attention state (conv, recurrent), as memory_plan.py lays it.
            self._kv = {_layer_slot(name): _desc(slot) for name, slot in self.plan.kv.items()}
            for i in range(self.num_layers):
                if (i, "k") not in self._kv and (i, "conv") not in self._kv:
                    raise LlmbuildError(f"{self.path}: section plan: kv: layer {i} has neither a KV cache nor a state")
            for (i, which), kv in self._kv.items():  # [1, S, kv_heads, head_dim]
                if which in "kv" and (len(kv.shape) != 4 or kv.shape[1] != self.S):
                    raise LlmbuildError(f"{self.path}: section plan: kv.layers.{i}.{which}: expected a [1, "
                                        f"{self.S}, heads, dim] cache, got {list(kv.shape)}")
            self.has_state = any(which == "conv" for _, which in self._kv)
            weight_region = tuple(int(x) for x in self.plan.regions["weight"])
        except BINARY_FAULTS as exc:
            raise LlmbuildError(f"{self.path}: section plan: not the plan this binary's nets need "
                                f"({type(exc).__name__}: {one_line(str(exc))})") from None
        self.device: Executor
        if faithful:
            from llmbuild.chips import load_chip

            # the chip the binary was built for: its local memory, whatever the programs claim
            lmem = load_chip(self.meta["chip"]).lmem_bytes
            self.device = Device(int(self.meta["memory"]["total_bytes"]), weight_region, lmem,
                                 weights=self.container.section("weights"))
        else:
            # Weights are read from the file as they are used (a memory map would keep every page read
            # resident: a 7B binary's 5 GB each token), decoded copies kept up to the host path's cache.
            entry = self.container.entries["weights"]
            image = FileImage(self.path, entry.offset, entry.size, weight_region[0])
            caches = [desc for (_, which), desc in self._kv.items() if which in "kv"]
            host = HostExecutor(image, weight_region, caches, self.L, cache_bytes=cache_bytes)
            host.half = host.half or _decoded_bytes(self.plan) > host.cache_bytes
            self.device = host
        self.nets = _Programs(self.container, {n["name"]: n["section"] for n in self.meta["nets"]},
                              int(self.meta["memory"]["total_bytes"]), commands=faithful)
        self.history = 0  # rows of the KV cache that hold real tokens
        self.counts = StageCounts()
        self._vision: Any = None

    @property
    def vision(self) -> Any:
        """The binary's vit net (runtime/vision.py), loaded when first asked for."""
        if self._vision is None:
            from llmbuild.runtime.vision import VisionNet

            meta = self.meta.get("vision")
            if not isinstance(meta, dict):
                raise LlmbuildError(f"{self.path}: this binary has no vision net (a text model takes no images)")
            lmem = None
            if self.faithful:
                from llmbuild.chips import load_chip

                lmem = load_chip(self.meta["chip"]).lmem_bytes
            self._vision = VisionNet(self.container, meta, self.faithful, lmem)
        return self._vision

    def release_weights(self) -> None:
        """Give back what the host path keeps decoded (a caller about to need the memory: the image check
        before it runs its streamed reference in the same process); a later run decodes them again."""
        from llmbuild.numerics import buffer_pool

        release = getattr(self.device, "release_weights", None)
        if release is not None:
            release()
            buffer_pool.clear()  # the pool would keep them for reuse: the memory is wanted elsewhere

    def load_weights(self) -> None:
        """On the host path, read the weights of the nets a conversation runs (embeddings, the first-chunk
        and decode blocks, the head) into the host's cache and bind their programs now, as a model load
        does: otherwise the first prompt pays for them. The simulated device reads its weights as it runs."""
        load = getattr(self.device, "load", None)
        if load is None:
            return
        layers = range(self.num_layers)
        for net in ("embedding", "embedding_cache", *(f"block_{i}" for i in layers),
                    *(f"block_cache_{i}" for i in layers), "lm_head"):
            if net not in self.nets:
                continue
            prog = self.nets[net]
            try:
                load(prog)
            except BINARY_FAULTS as exc:  # as `_run` says of a program that cannot run, at load instead
                raise LlmbuildError(f"{self.path}: section {self.nets.section(net)}: its weights cannot be read "
                                    f"({type(exc).__name__}: {one_line(str(exc))})") from None

    # ---- one chunk / one token ----------------------------------------------------------------

    def reset(self) -> None:
        self.history = 0

    def truncate(self, rows: int) -> None:
        """Forget the cache rows from `rows` on: they are masked from now on and overwritten later. A model
        with linear-attention state forgets everything instead (its state holds every token at once); the
        caller reads `history` afterwards to know what to prefill."""
        if not 0 <= rows <= self.history:
            raise ValueError(f"truncate to {rows} rows: the cache holds {self.history}")
        self.history = rows if not self.has_state or rows == self.history else 0

    def _run(self, net: str, inputs: dict[str, np.ndarray], rows: int | None = None) -> Program:
        """`rows`: the real tokens of a prefill chunk; the host path computes only their row tiles (the
        simulated device runs the static net whole, as the chip does)."""
        prog = self.nets[net]
        try:
            takes = {name for name, _ in prog.inputs}
            for name, value in inputs.items():
                if name in takes:  # a linear-attention layer takes no mask or positions, a full one no token mask
                    self.device.set_input(prog, name, value)
            if rows is not None and not self.faithful:
                self.device.run(prog, active_rows=rows)  # type: ignore[call-arg]
            else:
                self.device.run(prog)  # the simulated device runs the static net whole, as the chip does
        except BINARY_FAULTS as exc:
            # validate_program checked the program's structure; what its attributes ask of a kernel is only
            # known when it runs (a binary from a buggy or hostile writer): one error naming the section.
            raise LlmbuildError(f"{self.path}: section {self.nets.section(net)}: the program cannot run "
                                f"({type(exc).__name__}: {one_line(str(exc))})") from None
        return prog

    def layer_state(self, layer: int) -> dict[str, np.ndarray]:
        """What layer `layer` carries to the next call, as float32 copies: its KV cache's filled rows (`k`,
        `v`) or its linear-attention state (`conv`, the window; `recurrent`)."""
        out = {}
        for (i, which), desc in self._kv.items():
            if i == layer:
                value = np.array(self.device.read(desc), dtype=np.float32)
                out[which] = value[:, : self.history] if which in "kv" else value
        return out

    def _store_kv(self, layer: int, prog: Program, rows: int) -> None:
        outputs = dict(prog.outputs)
        if "present_k" in outputs:
            for which in "kv":
                src = prog.tensors[outputs[f"present_{which}"]]
                self.device.copy_rows(src, self._kv[layer, which], self.history, rows)
        if "present_conv" in outputs:
            # The window is the last K - 1 rows of (window, new rows): the old rows move up, the new ones
            # follow (a first chunk's window starts as zeros, the convolution's padding).
            window = self._kv[layer, "conv"]
            if self.history == 0:
                self.device.clear(window)
            self.device.shift_rows(prog.tensors[outputs["present_conv"]], window, rows)
            state = self._kv[layer, "recurrent"]
            self.device.copy_rows(prog.tensors[outputs["present_recurrent"]], state, 0, state.shape[1])

    def _logits(self, last_block: Program, row: int) -> np.ndarray:
        hidden = self.device.get_output(last_block, "hidden_states")[0, row]
        prog = self._run("lm_head", {"hidden_states": hidden.reshape(1, -1)})
        return self.device.get_output(prog, "logits")[0]

    @_quiet
    def prefill_chunk(self, ids: list[int], rows: dict[int, np.ndarray] | None = None) -> np.ndarray:
        """Run up to L tokens after the current history; returns the last token's logits. `rows`: index in
        `ids` -> the hidden row that replaces that token's embedding (an image's features)."""
        n = len(ids)
        if not 0 < n <= self.L:
            raise LlmbuildError(f"a chunk holds 1..{self.L} tokens, got {n}")
        if self.history + n > self.S:
            raise CacheFullError(
                f"KV cache full: {self.history} + {n} tokens exceed the sequence capacity {self.S}"
            )
        padded = np.zeros((1, self.L), dtype=np.int32)
        padded[0, :n] = ids
        real = np.zeros((1, self.L, 1), np.float32)  # a linear-attention layer's token mask
        real[0, :n] = 1
        self._run("embedding", {"input_ids": padded}, n)
        if rows:
            embedding = self.nets["embedding"]
            hidden = np.array(self.device.get_output(embedding, "hidden_states"), dtype=np.float32)
            for row, value in rows.items():
                hidden[0, row] = value
            self.device.set_output(embedding, "hidden_states", hidden)
        first = self.history == 0
        if first:
            pos, mask = masks.prefill(n, self.L, self.S)
        else:
            pos, mask = masks.prefill_kv(n, self.history, self.L, self.S)
        prog = self.nets["embedding"]
        for i in range(self.num_layers):
            net = f"block_{i}" if first else f"block_kv_{i}"
            prog = self._run(net, {"position_ids": pos, "attention_mask": mask, "token_mask": real}, n)
            self._store_kv(i, prog, n)
        if first:
            self.counts.prefill += n
        else:
            self.counts.prefill_kv += n
        self.history += n
        return self._logits(prog, n - 1)

    @_quiet
    def decode_token(self, token: int) -> np.ndarray:
        if self.history >= self.S:
            raise CacheFullError(f"KV cache full: {self.history} tokens fill the sequence capacity {self.S}")
        prog = self._run("embedding_cache", {"input_ids": np.array([[token]], dtype=np.int32)})
        pos, mask = masks.decode(self.history, self.S)
        for i in range(self.num_layers):
            prog = self._run(f"block_cache_{i}", {"position_ids": pos, "attention_mask": mask})
            self._store_kv(i, prog, 1)
        self.counts.decode += 1
        self.history += 1
        return self._logits(prog, 0)

    def prefill(self, ids: list[int], rows: dict[int, np.ndarray] | None = None) -> np.ndarray:
        """A prompt of any length: the first chunk by `prefill`, the rest by `prefill_kv`. `rows`: index in
        `ids` -> a row replacing that token's embedding (image features, `image_rows`)."""
        if not ids:
            raise LlmbuildError("empty prompt")
        logits = None
        for start in range(0, len(ids), self.L):
            chunk = {i - start: v for i, v in (rows or {}).items() if start <= i < start + self.L}
            logits = self.prefill_chunk(ids[start : start + self.L], chunk)
        assert logits is not None
        return logits

    def image_rows(self, ids: list[int], images: list[np.ndarray]) -> dict[int, np.ndarray]:
        """Index in `ids` -> image feature row: the i-th run of image-token ids takes the i-th image's
        features (prepared as their family's runtime part prepares them), computed by the vit net."""
        runs = [rows for p in images for rows in self.vision.run_rows(p)]  # a MiniCPM-V image: a run per slice
        return image_rows(ids, runs, self.vision.meta)

    def generate(
        self, prompt: list[int], max_new_tokens: int, eos_ids: tuple[int, ...] = (),
        images: list[np.ndarray] | None = None,
    ) -> tuple[list[int], list[np.ndarray]]:
        """Greedy generation after the current history. Returns (new ids, logits per step). `images`: the
        pixels of the images whose token runs the prompt holds, in order."""
        out: list[int] = []
        steps: list[np.ndarray] = []
        logits = self.prefill(prompt, self.image_rows(prompt, images) if images else None)
        for _ in range(max_new_tokens):
            steps.append(logits)
            token = int(np.argmax(logits))
            out.append(token)
            if token in eos_ids or len(out) == max_new_tokens:
                break
            logits = self.decode_token(token)
        return out, steps


def _layer_slot(name: str) -> tuple[int, str]:
    """`layers.3.k` -> (3, "k")."""
    _, layer, which = name.split(".", 2)
    return int(layer), which


def _decoded_bytes(plan: MemoryPlan) -> int:
    """The weights decoded to float32: 4-bit levels (bytes holding two) become 8 floats a byte."""
    total = 0
    for slot in plan.weights.values():
        count = 1
        for d in slot.shape:
            count *= d
        total += count * (8 if slot.dtype == "u8" else 4)
    return total


def load_tokenizer(model: CompiledModel):
    from llmbuild.runtime.tokenizer import BinaryTokenizer

    meta = model.meta
    try:
        return BinaryTokenizer(
            bytes(model.container.section("tokenizer")).decode(),
            meta.get("chat_template"),
            meta.get("bos_token_id"),
            list(meta.get("eos_token_ids") or []),
            meta.get("special_tokens"),
        )
    except LlmbuildError:
        raise
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises plain Exceptions for bad JSON
        raise LlmbuildError(f"{model.path}: section tokenizer: not a tokenizer this runtime reads "
                            f"({type(exc).__name__}: {one_line(str(exc)[:200])})") from None


def image_runs(ids: list[int], meta: dict) -> list[int]:
    """Where each image's run of image tokens starts in `ids`: a run of the vision meta's `image_token_id`
    right after an image or slice start token (`<img>`, `<image>`, `<slice>`). The same token elsewhere
    (a MiniCPM-V user who writes `<unk>`) is text, as the published processors read it."""
    token = int(meta["image_token_id"])
    starts = {int(meta[k]) for k in ("image_start_id", "slice_start_id") if meta.get(k) is not None}
    return [i for i, t in enumerate(ids) if t == token and i > 0 and ids[i - 1] in starts]


def image_rows(ids: list[int], features: list[np.ndarray], meta: dict) -> dict[int, np.ndarray]:
    """Index in `ids` -> feature row, the image runs (`image_runs`) filled by `features` in order (each run
    exactly one image's rows, as the prompt builders make them)."""
    image_token_id = int(meta["image_token_id"])
    runs = image_runs(ids, meta)
    if len(runs) != len(features):
        raise LlmbuildError(f"the prompt holds {len(runs)} image(s) (runs of token {image_token_id}), "
                            f"got {len(features)} image(s)")
    rows: dict[int, np.ndarray] = {}
    for start, feats in zip(runs, features, strict=True):
        end = start
        while end < len(ids) and ids[end] == image_token_id:
            end += 1
        if end - start != len(feats):
            raise LlmbuildError(f"an image takes {len(feats)} tokens, the prompt's run at {start} has {end - start}")
        rows.update({start + k: feats[k] for k in range(len(feats))})
    return rows

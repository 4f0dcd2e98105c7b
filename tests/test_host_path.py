"""The host path executes the same binary and the same program instructions as the simulated device
and gives the same tokens and logits, without the byte-array round trips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmbuild.runtime.compiled_model import CompiledModel
from llmbuild.runtime.tokenizer import BinaryTokenizer

TINY_PROMPT = [1, 5, 9, 42, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]  # > L: two chunks


def _binary(build: Path, recipe: str) -> Path:
    return build / recipe / f"{recipe}.llmb"


def _prompt(model: CompiledModel, recipe: str) -> list[int]:
    if recipe.startswith("smollm2"):
        from llmbuild.runtime.compiled_model import load_tokenizer

        tok: BinaryTokenizer = load_tokenizer(model)
        return tok.chat_ids([{"role": "user", "content": "What is the capital of France?"}])
    return TINY_PROMPT


def _equal(a: list[np.ndarray] | np.ndarray, b: list[np.ndarray] | np.ndarray) -> bool:
    """Bit for bit: the host path claims the device's arithmetic, not a tolerance around it."""
    a, b = (x if isinstance(x, list) else [x] for x in (a, b))
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("recipe", ["qwen2_tiny_f32", "llama_tiny_f32", "smollm2_135m_bf16"])
def test_host_path_gives_the_faithful_ids_and_logits(runtime_build: Path, recipe: str) -> None:
    faithful = CompiledModel(_binary(runtime_build, recipe), faithful=True)
    host = CompiledModel(_binary(runtime_build, recipe), faithful=False)
    prompt = _prompt(faithful, recipe)
    want_ids, want_logits = faithful.generate(prompt, 16)
    got_ids, got_logits = host.generate(prompt, 16)
    assert got_ids == want_ids and len(got_ids) == 16
    assert _equal(got_logits, want_logits)
    # A later turn on top of the cache: the prefill_kv nets.
    more = [5, 6, 7]
    assert _equal(host.prefill(more), faithful.prefill(more))
    assert host.counts == faithful.counts


def test_host_path_reads_the_op_list_without_the_device_commands(runtime_build: Path) -> None:
    """The host path decodes each program's op list only (binary/program.py: `commands=False`); the same
    ops as the simulated device reads, whose programs keep their groups' commands."""
    faithful = CompiledModel(_binary(runtime_build, "qwen2_tiny_f32"), faithful=True)
    host = CompiledModel(_binary(runtime_build, "qwen2_tiny_f32"), faithful=False)
    for net in ("block_0", "block_cache_1", "lm_head"):
        assert host.nets[net].instrs == faithful.nets[net].instrs and host.nets[net].tensors
        assert faithful.nets[net].groups and not host.nets[net].groups


def test_a_large_input_given_again_is_rounded_once() -> None:
    """A prefill's mask, the same array for every layer, is rounded to the input's type once; another array,
    or the same one as an input of another type, is rounded again."""
    from llmbuild.binary.program import TensorDesc
    from llmbuild.runtime.host import LARGE_INPUT, HostExecutor

    host = HostExecutor(b"", (0, 0))
    side = int(LARGE_INPUT**0.5)
    mask = np.full((1, 1, side, side), 1 + 2**-10, np.float32)
    bf16, f32 = TensorDesc("bf16", mask.shape, 0), TensorDesc("f32", mask.shape, 0)
    first = host._stored_input(mask, bf16)
    assert host._stored_input(mask, bf16) is first and not first.flags.writeable
    assert (first == 1).all()  # rounded to bf16
    assert (host._stored_input(mask, f32) == mask).all()
    assert host._stored_input(mask.copy(), bf16) is not first


def test_host_path_decodes_each_weight_once(runtime_build: Path) -> None:
    host = CompiledModel(_binary(runtime_build, "qwen2_tiny_f32"), faithful=False)
    host.generate(TINY_PROMPT, 4)
    weights = dict(host.device._weights)
    host.generate([3, 4], 4)
    assert host.device._weights.keys() == weights.keys()
    assert all(host.device._weights[k] is w for k, w in weights.items())
    # Tied embeddings: the Gather table and the lm_head weight are one tensor, decoded once.
    embedding = host.plan.weights["embed_tokens.weight"].address
    assert sum(1 for address, _, _ in weights if address == embedding) == 1


@pytest.mark.parametrize("recipe", ["qwen2_tiny_f32", "smollm2_135m_bf16"])
def test_released_weights_are_decoded_again_with_the_same_bits(runtime_build: Path, recipe: str) -> None:
    """What the image check does before its reference: the decoded weights given back, the next run the
    same (logits bit for bit)."""
    host = CompiledModel(_binary(runtime_build, recipe), faithful=False)
    ids, logits = host.generate(TINY_PROMPT, 4)
    assert host.device._weights or host.device._dequantized
    host.release_weights()
    assert not host.device._weights and not host.device._dequantized and host.device.cached_bytes == 0
    host.reset()
    again, logits_again = host.generate(TINY_PROMPT, 4)
    assert again == ids
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(logits, logits_again, strict=True))


def test_faithful_and_host_sessions_agree(runtime_build: Path) -> None:
    from llmbuild.runtime.session import Session

    replies = []
    for faithful in (True, False):
        s = Session(_binary(runtime_build, "llama_tiny_f32"), faithful=faithful)
        replies.append((s.generate([1, 5, 9, 42], 6), s.generate([7, 8, 9], 6), s.stats))
    assert replies[0] == replies[1]


@pytest.mark.parametrize("recipe", ["qwen2_tiny_f32", "smollm2_135m_bf16"])
@pytest.mark.parametrize("where", ["file", "half"])
def test_weights_left_in_their_storage_format_give_the_same_bits(runtime_build: Path, recipe: str, where: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """With no room to decode weights (a 7B binary on a host), products read them from the binary file tile by
    tile; with room for 16 bits a weight only (`half`), 16-bit weights are kept as stored and decoded per
    tile. Every logit keeps its bits."""
    from llmbuild.numerics.stored import StoredTensor
    from llmbuild.runtime import host

    cached = CompiledModel(_binary(runtime_build, recipe), faithful=False)
    prompt = _prompt(cached, recipe)
    want_ids, want_logits = cached.generate(prompt, 6)
    monkeypatch.setattr(host, "ALWAYS_DECODED_BYTES", 4096)
    if where == "file":
        monkeypatch.setenv("LLMBUILD_HOST_CACHE_MB", "0")
    lazy = CompiledModel(_binary(runtime_build, recipe), faithful=False)
    lazy.device.half = where == "half"
    got_ids, got_logits = lazy.generate(prompt, 6)
    assert got_ids == want_ids
    assert _equal(got_logits, want_logits)
    stored = [w for w in lazy.device._weights.values() if isinstance(w, StoredTensor)]
    if where == "file":
        assert stored and lazy.device.cached_bytes < 4096 * 64
    elif recipe.startswith("smollm2"):  # bf16 weights kept as their 16 bits, in memory
        assert stored and all(isinstance(w.raw, np.ndarray) for w in stored)


def test_a_short_prompt_computes_only_its_rows(runtime_build: Path) -> None:
    """A 3-token prefill on the host computes its 3 rows only (products and attention told so), with the
    bits the static net gives those rows on the simulated device."""
    faithful = CompiledModel(_binary(runtime_build, "qwen2_tiny_f32"), faithful=True)
    host = CompiledModel(_binary(runtime_build, "qwen2_tiny_f32"), faithful=False)
    prompt = [1, 5, 9]
    assert _equal(host.prefill(prompt), faithful.prefill(prompt))
    programs = host.device._programs.values()
    skipping = [a for hp in programs if hp.prog.stage == "prefill" for a in hp._row_attrs]
    assert skipping and all(a.get("active_rows") == 3 for a in skipping)
    assert host.decode_token(7).argmax() == faithful.decode_token(7).argmax()


def test_a_table_only_gathered_stays_in_the_image() -> None:
    """An untied embedding is only looked up by rows: a kept decoded copy (1 GB for Llama-3-8B's, in 16
    bits) would speed up nothing, so the host path leaves it in the binary; a table a product reads (a tied
    lm_head) is kept, and gathers then read that copy."""
    from llmbuild.binary.program import TensorDesc
    from llmbuild.numerics.formats import encode
    from llmbuild.numerics.stored import StoredTensor, materialize
    from llmbuild.runtime.host import ALWAYS_DECODED_BYTES, HostExecutor

    rows, cols = 1024, 512
    assert 4 * rows * cols > ALWAYS_DECODED_BYTES
    raw = encode(np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32), "bf16")
    host = HostExecutor(memoryview(raw.tobytes()), (0, raw.nbytes), cache_bytes=1 << 30)
    table = TensorDesc("bf16", (rows, cols), 0)
    gathered = host.weight(table, gathered=True)
    assert isinstance(gathered, StoredTensor) and host.cached_bytes == 0
    kept = host.weight(table)  # a product's read keeps it: its 16 bits (float32 without the one-row kernel)
    assert np.array_equal(gathered.take(np.array([3, 1000])), materialize(kept)[[3, 1000]])
    assert host.cached_bytes == (2 if host.half else 4) * rows * cols
    assert host.weight(table, gathered=True) is kept

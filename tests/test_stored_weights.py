"""Weights read in their storage format (StoredTensor, row readers) give exactly the values and products
of decoded ones; products skip the row tiles after `active_rows` without changing the rows they keep;
an object's weight file round-trips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmbuild.numerics.formats import STORAGE, compute_dtype, decode, encode
from llmbuild.numerics.kernels import KERNELS
from llmbuild.numerics.stored import StoredTensor
from llmbuild.numerics.weight_product import tiled_product


def _bf16(rng: np.random.Generator, *shape: int) -> tuple[np.ndarray, np.ndarray]:
    """(raw bf16 words, their float32 values)."""
    raw = encode(rng.standard_normal(shape).astype(np.float32), "bf16")
    return raw, decode(raw, "bf16")


@pytest.mark.parametrize("attrs", [{}, {"tile_n": 48}, {"tile_m": 16}, {"tile_m": 16, "tile_n": 40}])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_a_stored_weight_gives_the_bits_of_the_decoded_one(attrs: dict, rows: int) -> None:
    rng = np.random.default_rng(1)
    raw, w = _bf16(rng, 200, 96)
    x = rng.standard_normal((1, rows, 96)).astype(np.float32)
    want = tiled_product(attrs, x, w)
    got = tiled_product(attrs, x, StoredTensor(raw, "bf16"))
    assert got.dtype == np.float32 and np.array_equal(got, want)


@pytest.mark.parametrize("active", [1, 15, 16, 17, 63])
def test_active_rows_keep_the_bits_of_the_rows_they_compute(active: int) -> None:
    rng = np.random.default_rng(2)
    w = rng.standard_normal((80, 32)).astype(np.float32)
    x = rng.standard_normal((1, 64, 32)).astype(np.float32)
    attrs = {"tile_m": 16}
    full = tiled_product(attrs, x, w)
    part = tiled_product({**attrs, "active_rows": active}, x, w)
    assert np.array_equal(part[:, :active], full[:, :active])  # a row's sums do not depend on its tile
    assert not part[:, active:].any()


def _quantized(rng: np.random.Generator, n: int, k: int, g: int) -> tuple[np.ndarray, ...]:
    packed = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    scale_raw = encode((rng.random((n, k // g)) * 0.02 + 0.001).astype(np.float32), "bf16")
    zp = rng.integers(0, 16, size=(n, k // g), dtype=np.uint8)
    return packed, scale_raw, zp


def test_a16_matmul_dequantizes_tile_by_tile_to_the_same_bits() -> None:
    rng = np.random.default_rng(3)
    packed, scale_raw, zp = _quantized(rng, 96, 128, 32)
    attrs = {"packed": True, "q_group_size": 32, "dequant_dtype": "bf16", "tile_n": 32}
    x = rng.standard_normal((1, 1, 128)).astype(np.float32)
    want = KERNELS["A16MatMul"](attrs, x, packed.copy(), decode(scale_raw, "bf16"), zp.copy())
    got = KERNELS["A16MatMul"](attrs, x, StoredTensor(packed, "u8"), StoredTensor(scale_raw, "bf16"),
                               StoredTensor(zp, "u8"))
    assert np.array_equal(got, want)
    idx = np.array([[3, 95, 0]], dtype=np.int32)
    want_rows = KERNELS["A16Gather"](attrs, packed, decode(scale_raw, "bf16"), zp, idx)
    got_rows = KERNELS["A16Gather"](attrs, StoredTensor(packed, "u8"), StoredTensor(scale_raw, "bf16"),
                                    StoredTensor(zp, "u8"), idx)
    assert np.array_equal(got_rows, want_rows)


@pytest.mark.parametrize("attrs", [{}, {"tile_n": 48}])
def test_a_one_row_product_decoded_in_blocks_has_the_bits_of_the_whole_one(attrs: dict) -> None:
    """A decode step's product decodes a stored weight a few rows at a time into one buffer (K = 8192: 16
    rows a block, 13 blocks): every output is the one the whole decoded matrix gives, bf16 and 4-bit."""
    rng = np.random.default_rng(5)
    raw, w = _bf16(rng, 200, 8192)
    x = rng.standard_normal((1, 1, 8192)).astype(np.float32)
    assert np.array_equal(tiled_product(attrs, x, StoredTensor(raw, "bf16")), tiled_product(attrs, x, w))
    packed, scale_raw, zp = _quantized(rng, 200, 8192, 64)
    q_attrs = {**attrs, "packed": True, "q_group_size": 64, "dequant_dtype": "bf16"}
    scale = decode(scale_raw, "bf16")
    whole = KERNELS["A16MatMul"](q_attrs, x, packed.copy(), scale, zp.copy())
    got = KERNELS["A16MatMul"](q_attrs, x, StoredTensor(packed, "u8"), StoredTensor(scale_raw, "bf16"),
                               StoredTensor(zp, "u8"))
    assert np.array_equal(got, whole)


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize(("n", "k", "tile_n"),
                         [(8192, 576, 1024), (1536, 576, 256), (576, 1536, 64), (8960, 1536, 512)])
def test_a_one_row_product_has_the_bits_of_its_n_tiles_on_any_threads(n: int, k: int, tile_n: int, threads: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode step's product (numerics/vector_product.py) computes each output from its own weight row: the
    N tiles the device computes one by one, the whole product on 1 or 2 threads, the weight decoded or as
    stored, and numpy's reference agree bit for bit (SmolLM2's and the 1.5B's shapes, the lm_head's tiling)."""
    from llmbuild.numerics import vector_product

    monkeypatch.setenv("OPENBLAS_NUM_THREADS", threads)  # numerics.parallel.workers() reads it
    rng = np.random.default_rng(n + k)
    raw, w = _bf16(rng, n, k)
    x = rng.standard_normal((1, 1, k)).astype(np.float32)
    tiles = np.concatenate([tiled_product({}, x, w[c : c + tile_n]) for c in range(0, n, tile_n)], axis=-1)
    got = tiled_product({"tile_n": tile_n}, x, w)
    assert got.shape == (1, 1, n) and np.array_equal(got, tiles)
    assert np.array_equal(tiled_product({"tile_n": tile_n}, x, StoredTensor(raw, "bf16")), got)
    assert np.array_equal(got[0, 0], vector_product.reference(x[0, 0], w))


@pytest.mark.parametrize("attrs", [{"tile_m": 32}, {"tile_m": 32, "tile_n": 64}])
def test_a_last_row_tile_of_one_row_has_the_bits_of_the_device_command(attrs: dict) -> None:
    """33 rows in tiles of 32: the whole op (the host path) computes its last tile as the device's command
    for that tile does, a one-row product (vector_product.py), not a BLAS call over one row."""
    rng = np.random.default_rng(8)
    w = rng.standard_normal((192, 128)).astype(np.float32)
    x = rng.standard_normal((1, 33, 128)).astype(np.float32)
    whole = tiled_product(attrs, x, w)
    commands = [tiled_product(attrs, np.ascontiguousarray(x[:, r : r + 32]), w) for r in (0, 32)]
    assert np.array_equal(whole, np.concatenate(commands, axis=1))


def test_a_gather_reads_only_the_rows_it_looks_up() -> None:
    rng = np.random.default_rng(4)
    raw, table = _bf16(rng, 1000, 16)
    idx = np.array([[5, 999, 5, 0]], dtype=np.int32)
    assert np.array_equal(KERNELS["Gather"]({"axis": 0}, StoredTensor(raw, "bf16"), idx),
                          KERNELS["Gather"]({"axis": 0}, table, idx))


def test_an_hf_table_read_by_rows_equals_the_whole_tensor(tmp_path: Path) -> None:
    from llmbuild.frontend.hf import HFSource
    from llmbuild.frontend.synthetic import make_synthetic_checkpoint

    make_synthetic_checkpoint({"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 1,
                               "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
                               "vocab_size": 300}, 7, tmp_path / "ckpt")
    source = HFSource(tmp_path / "ckpt")
    whole = source.tensor("embed_tokens.weight")
    reader = source.reader("embed_tokens.weight")
    assert reader.shape == whole.shape
    assert np.array_equal(reader.rows(10, 250), whole[10:250])
    assert np.array_equal(reader.take(np.array([[3, 299]])), whole[[[3, 299]]])


def test_a_weight_file_round_trips_at_its_planned_addresses(tmp_path: Path) -> None:
    from llmbuild.artifacts.weight_file import open_weight_files, weight_file_tensors, write_weight_file
    from llmbuild.binary.memory_map import MemoryPlan, Slot

    rng = np.random.default_rng(5)
    table = rng.standard_normal((300, 64)).astype(np.float32)
    levels = rng.integers(0, 256, size=(32, 8), dtype=np.uint8)
    plan = MemoryPlan(4096, {"t": Slot(8192, "bf16", (300, 64)), "q": Slot(0, "u8", (32, 8))}, {}, {},
                      {"weight": (0, 65536)}, 65536)
    path = tmp_path / "weights.safetensors"
    write_weight_file(path, plan, {"t": lambda lo, hi: table[lo:hi], "q": levels})
    found = weight_file_tensors(path, plan)
    assert [(t.address, t.name) for t in found] == [(0, "q"), (8192, "t")]
    assert path.read_bytes()[found[0].begin:found[0].end] == levels.tobytes()
    image = open_weight_files([path], plan)
    assert np.array_equal(image.view(8192, 300 * 64 * 2).view(np.uint16).reshape(300, 64), encode(table, "bf16"))
    assert np.array_equal(image.view(0, 256).reshape(32, 8), levels)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:  # a file a person (and torch) can open
        assert f.get_tensor("q").tolist() == levels.tolist()
        assert np.array_equal(f.get_tensor("t").float().numpy(), decode(encode(table, "bf16"), "bf16"))


@pytest.mark.parametrize("dtype", sorted(STORAGE))
def test_compute_dtype_is_what_decode_returns(dtype: str) -> None:
    """Callers decide (the compiled dequantizer or not) from `compute_dtype` before reading a tensor: it
    must name the type `decode` then gives."""
    raw = np.zeros((2, 3), dtype=STORAGE[dtype][1])
    assert decode(raw, dtype).dtype == compute_dtype(dtype)

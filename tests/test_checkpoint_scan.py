"""`llmbuild prepare` refuses a broken Hugging Face checkpoint before any work: a NaN or Inf in a weight,
a missing tensor, a wrong shape, each one line naming the file and the tensor (frontend/checkpoint_scan.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from llmbuild import LlmbuildError
from llmbuild.frontend.checkpoint_scan import scan_checkpoint
from llmbuild.frontend.hf import HFSource
from llmbuild.frontend.synthetic import make_synthetic_checkpoint

CONFIG = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "rope_theta": 10000.0,
          "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "max_position_embeddings": 256}


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Path:
    make_synthetic_checkpoint(CONFIG, 0, tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _header(path: Path) -> tuple[int, dict]:
    data = path.read_bytes()
    (length,) = struct.unpack_from("<Q", data, 0)
    return 8 + length, json.loads(data[8 : 8 + length])


def _file(checkpoint: Path) -> Path:
    return next(checkpoint.glob("*.safetensors"))


def test_a_good_checkpoint_passes(checkpoint: Path) -> None:
    scan_checkpoint(HFSource(checkpoint))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_non_finite_weight_is_named(checkpoint: Path, value: float) -> None:
    path = _file(checkpoint)
    start, header = _header(path)
    name = "model.layers.1.mlp.down_proj.weight"
    info = header[name]
    data = bytearray(path.read_bytes())
    itemsize = {"F32": 4, "BF16": 2, "F16": 2}[info["dtype"]]
    word = np.array([value], dtype=np.float32)
    raw = word.tobytes() if itemsize == 4 else (word.view(np.uint32) >> 16).astype("<u2").tobytes()
    at = start + info["data_offsets"][0] + 37 * itemsize
    data[at : at + itemsize] = raw
    path.write_bytes(bytes(data))
    with pytest.raises(LlmbuildError) as err:
        scan_checkpoint(HFSource(checkpoint))
    message = str(err.value)
    assert str(path) in message and repr(name) in message and "value 37 is NaN or Inf" in message
    assert "\n" not in message


def test_a_missing_tensor_and_a_wrong_shape_are_named(checkpoint: Path) -> None:
    path = _file(checkpoint)
    start, header = _header(path)
    data = path.read_bytes()
    for edit, expected in (("drop", "missing tensor 'model.layers.0.mlp.up_proj.weight'"),
                           ("shape", "tensor 'model.layers.0.mlp.up_proj.weight' has shape [64, 128]")):
        changed = dict(header)
        if edit == "drop":
            del changed["model.layers.0.mlp.up_proj.weight"]
        else:
            changed["model.layers.0.mlp.up_proj.weight"] = dict(header["model.layers.0.mlp.up_proj.weight"],
                                                                 shape=[64, 128])
        blob = json.dumps(changed).encode()
        blob += b" " * (-len(blob) % 8)
        path.write_bytes(struct.pack("<Q", len(blob)) + blob + data[start:])
        with pytest.raises(LlmbuildError, match=expected.replace("[", r"\[").replace("]", r"\]")):
            scan_checkpoint(HFSource(checkpoint))

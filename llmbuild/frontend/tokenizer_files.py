"""Tokenizer files: written from a GGUF's metadata, and read back as one bundle to embed in a binary.

A GGUF carries no tokenizer.json, only llama.cpp's vocabulary, merges and token types. We rebuild
the same byte-level BPE that transformers' GGUF loader builds (GPT-2 style), so the ids agree.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from llmbuild import LlmbuildError, one_line

TOKEN_TYPE_CONTROL = 3  # llama.cpp's token types: 3 marks special tokens like <|im_end|>
TOKEN_TYPE_USER_DEFINED = 4  # ... and 4 added tokens that are matched whole but are not special

# GGUF `tokenizer.ggml.pre` names whose merges were learned over a split other than GPT-2's.
# The same table as transformers' GGUF loader, for the families we read; others use GPT-2's.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}


@dataclass(frozen=True)
class TokenizerBundle:
    tokenizer_json: str  # the `tokenizers` serialization, as written
    chat_template: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    unk_token: str | None


@cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, which byte-level vocabularies use."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def write_json(path: Path, data: Any) -> None:
    """Deterministic JSON: sorted keys, two-space indent, trailing newline."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def write_tokenizer_from_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json and generation_config.json for a GGUF's tokenizer."""
    from llmbuild.frontend.gguf_source import gguf_metadata

    meta = gguf_metadata(Path(gguf_path))
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise LlmbuildError(f"{gguf_path}: tokenizer.ggml.model {kind!r} is not supported (expected gpt2)")
    tokens: Sequence[str] = meta.get("tokenizer.ggml.tokens") or []  # gguf_index.LazyStrings
    if not tokens:
        raise LlmbuildError(f"{gguf_path}: missing metadata tokenizer.ggml.tokens")
    tokenizer = _byte_level_bpe(meta, tokens)

    def token(key: str) -> str | None:
        token_id = meta.get(f"tokenizer.ggml.{key}")
        return tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "pad_token": token("padding_token_id"),
        "unk_token": token("unknown_token_id"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": _context_length(meta),
    }
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = meta["tokenizer.chat_template"]
    write_json(out_dir / "tokenizer_config.json", config)
    generation = {
        key: meta[f"tokenizer.ggml.{src}"]
        for key, src in (
            ("bos_token_id", "bos_token_id"),
            ("eos_token_id", "eos_token_id"),
            ("pad_token_id", "padding_token_id"),
        )
        if meta.get(f"tokenizer.ggml.{src}") is not None
    }
    write_json(out_dir / "generation_config.json", generation)


def _context_length(meta: dict[str, Any]) -> int:
    return int(meta.get(f"{meta.get('general.architecture')}.context_length") or 1 << 30)


def _byte_level_bpe(meta: dict[str, Any], tokens: Sequence[str]) -> Any:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    alphabet = set(byte_alphabet().values())
    spell = byte_alphabet()
    # A token stored in plain text (outside the byte alphabet) is respelled byte by byte, so that
    # BPE can ever produce it; the same rule as transformers' loader.
    vocab = {
        (t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8"))): i for i, t in enumerate(tokens)
    }
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, fuse_unk=False, byte_fallback=False))
    split = PRE_TOKENIZER_SPLITS.get(meta.get("tokenizer.ggml.pre") or "")
    add_prefix_space = bool(meta.get("tokenizer.ggml.add_space_prefix", False))
    if split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()

    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    # A "control" token outside the byte alphabet is a llama.cpp mislabel; transformers skips it too.
    control = [t for t, k in zip(tokens, types, strict=True) if k == TOKEN_TYPE_CONTROL and set(t) <= alphabet]
    user = [t for t, k in zip(tokens, types, strict=True) if k == TOKEN_TYPE_USER_DEFINED and t in vocab]
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])

    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    single, special = ["$A:0"], []
    if meta.get("tokenizer.ggml.add_bos_token") and bos_id is not None:
        single.insert(0, f"{tokens[bos_id]}:0")
        special.append((tokens[bos_id], bos_id))
    if meta.get("tokenizer.ggml.add_eos_token") and eos_id is not None:
        single.append(f"{tokens[eos_id]}:0")
        special.append((tokens[eos_id], eos_id))
    pair = single + [s.replace("$A", "$B").replace(":0", ":1") for s in single]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=sorted(set(special), key=lambda p: p[1])
    )
    return tokenizer


def read_tokenizer_bundle(ckpt_dir: Path) -> TokenizerBundle:
    """The tokenizer of a prepared checkpoint directory (following source.json to an HF directory)."""
    directory = tokenizer_directory(Path(ckpt_dir))
    tokenizer_path = directory / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise LlmbuildError(f"{tokenizer_path}: missing; the checkpoint has no fast tokenizer")
    try:
        tokenizer_json = tokenizer_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LlmbuildError(f"{tokenizer_path}: cannot read the tokenizer: {one_line(str(exc))[:160]}") from None
    config = _optional_json(directory / "tokenizer_config.json")
    generation = _optional_json(directory / "generation_config.json")
    model_config = _optional_json(directory / "config.json")

    chat_template = _chat_template(config.get("chat_template"))
    jinja = directory / "chat_template.jinja"  # where transformers 5 saves it
    if chat_template is None and jinja.is_file():
        chat_template = jinja.read_text(encoding="utf-8")

    strings = {k: _token_string(config.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    try:
        ids = token_ids_by_string(tokenizer_json)
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
        raise LlmbuildError(f"{tokenizer_path}: cannot read the tokenizer: {one_line(str(exc))[:160]}") from None

    def token_ids(key: str, string_key: str) -> tuple[int, ...]:
        value = generation.get(key, model_config.get(key))
        if value is None:
            string = strings[string_key]
            return (ids[string],) if string in ids else ()
        return tuple(int(v) for v in value) if isinstance(value, list) else (int(value),)

    bos = token_ids("bos_token_id", "bos_token")
    return TokenizerBundle(
        tokenizer_json=tokenizer_json,
        chat_template=chat_template,
        bos_token_id=bos[0] if bos else None,
        eos_token_ids=token_ids("eos_token_id", "eos_token"),
        **strings,
    )


def tokenizer_directory(ckpt_dir: Path) -> Path:
    if (ckpt_dir / "tokenizer.json").is_file():
        return ckpt_dir
    pointer = _optional_json(ckpt_dir / "source.json")
    if pointer.get("kind") == "hf" and pointer.get("path"):
        return Path(pointer["path"])
    return ckpt_dir


def _optional_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    from llmbuild.frontend.hf import read_json

    return read_json(path)


def _chat_template(value: Any) -> str | None:
    # Older tokenizer_config.json files list named templates; "default" is the one chat uses.
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) else None


def _token_string(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken serialized as a dict
        value = value.get("content")
    return value if isinstance(value, str) else None


def token_ids_by_string(tokenizer_json: str) -> dict[str, int]:
    """A tokenizer.json's token strings and their ids (a BPE vocabulary and the added tokens)."""
    data = json.loads(tokenizer_json)
    vocab = data.get("model", {}).get("vocab")
    ids = dict(vocab) if isinstance(vocab, dict) else {}  # only BPE-style vocabularies map strings to ids
    ids.update({t["content"]: t["id"] for t in data.get("added_tokens") or []})
    return ids

"""Calibration data: a text file cut into token windows, the same ones every run.

GPTQ, AWQ and AutoRound all see the model's activations on a few sample sequences. We give them token
ids, not text: every library then sees exactly the windows we chose (AutoAWQ silently drops text samples
longer than its sequence length, auto-round's default dataset is a hub download).

Windows are non-overlapping and spread evenly over the whole text (window i starts at token
i * (n // samples)), so a text made of sections on different topics contributes all of them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from llmbuild import LlmbuildError

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "data" / "calibration"
DEFAULT_TEXT = SHIPPED_DIR / "english.txt"


def calibration_text(name_or_path: str | Path) -> Path:
    """A shipped text by name ("english" or "english.txt", in llmbuild/data/calibration/), else a path."""
    text = str(name_or_path)
    for candidate in (SHIPPED_DIR / text, SHIPPED_DIR / f"{text}.txt"):
        if "/" not in text and candidate.is_file():
            return candidate
    path = Path(text)
    if not path.is_file():
        shipped = ", ".join(sorted(p.stem for p in SHIPPED_DIR.glob("*.txt")))
        raise LlmbuildError(f"{path}: calibration text not found (shipped texts: {shipped})")
    return path


def calibration_ids(text_file: Path, tokenizer_dir: Path, samples: int, seq_length: int) -> list[list[int]]:
    """`samples` windows of `seq_length` token ids from `text_file`, tokenized by the tokenizer.json of
    `tokenizer_dir` without special tokens (the windows are cut from the middle of a text)."""
    from tokenizers import Tokenizer

    for name, value in (("samples", samples), ("seq_length", seq_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise LlmbuildError(f"calibration: {name} must be a positive integer, got {value!r}")
    text_file, tokenizer_path = Path(text_file), Path(tokenizer_dir) / "tokenizer.json"
    try:
        text = text_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LlmbuildError(f"{text_file}: calibration text not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LlmbuildError(f"{text_file}: cannot read calibration text as UTF-8: {exc}") from None
    if not tokenizer_path.is_file():
        raise LlmbuildError(f"{tokenizer_path}: missing; calibration needs the model's tokenizer")
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
    except Exception as exc:  # tokenizers raises plain Exception on a bad file
        raise LlmbuildError(f"{tokenizer_path}: cannot load tokenizer: {exc}") from None
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    need = samples * seq_length
    if len(ids) < need:
        raise LlmbuildError(
            f"{text_file}: {len(ids)} tokens with the tokenizer of {tokenizer_dir}, fewer than samples {samples} "
            f"x seq_length {seq_length} = {need}; use a longer text or fewer/shorter samples"
        )
    stride = len(ids) // samples
    return [ids[i * stride : i * stride + seq_length] for i in range(samples)]


def calibration_digest(ids: list[list[int]]) -> str:
    """sha256 of the windows: what a cache key needs to know about the calibration data."""
    return hashlib.sha256(json.dumps(ids, separators=(",", ":")).encode("ascii")).hexdigest()

"""Synthetic checkpoints: a tiny random model in Hugging Face layout, reproducible to the byte.

transformers loads the result offline like any downloaded checkpoint, so the whole pipeline
(import, compile, verify against transformers) runs without a hub. The tokenizer is a real
byte-level BPE trained on `llmbuild/data/corpus.txt`, so prompts tokenize like real text.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.families.layout import expected_shapes
from llmbuild.families.registry import family_for_hf_model_type, get_family
from llmbuild.families.spec import ModelSpec

CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus.txt"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_MIN_VOCAB = len(SPECIAL_TOKENS) + 256  # the specials plus one token per byte

# Init scales, tuned on the tiny recipe configs (3 families x 4 seeds x 2 prompts, 32 greedy
# tokens): the layers add far more to the residual stream than the embedding holds (gain 2), which
# keeps greedy decoding from settling on one token (with tied embeddings the input token's own
# logit otherwise wins and repeats forever), and the final norm scales logits to a spread of about
# LOGIT_STD units, so the top-2 gap dwarfs float32 rounding and greedy ties are rare.
EMBED_STD = 0.25  # embed_tokens and lm_head
LINEAR_GAIN = 2.0  # projection weights ~ N(0, gain^2 / fan_in)
LOGIT_STD = 6.0
BIAS_STD = 0.1
NORM_SPREAD = 0.1  # norm weights ~ scale * (1 + U(-spread, spread)), so a swapped norm would show


def make_synthetic_checkpoint(config: Mapping[str, Any], seed: int, out_dir: Path,
                              vision: Mapping[str, Any] | None = None) -> None:
    """Write an HF checkpoint (config, float32 safetensors, tokenizer, generation config) for
    `config` (config.json fields; model_type required) with weights from `seed`. With `vision` (a vision-
    language model's config.json fields besides the text model's, its `model_type` naming the family), also
    the whole vision-language model under `vlm/` (its family folder's `synthetic` module), sharing the text
    weights and the tokenizer, which then has the family's image tokens."""
    from llmbuild.frontend.atomic import atomic_directory
    from llmbuild.frontend.tokenizer_files import write_json

    hf_config = full_hf_config(config)
    arch = get_family(family_for_hf_model_type(hf_config["model_type"]))
    spec = arch.spec_from_hf_config(hf_config, origin="source.config")
    tensors = random_tensors(spec, seed)
    from llmbuild.families.registry import family_part, vision_family_for_hf_model_type

    # vision.config's model_type names the family whose folder writes the vision part (prepare sets it).
    family = vision_family_for_hf_model_type(vision.get("model_type")) if vision is not None else None
    if vision is not None and family is None:
        raise LlmbuildError(f"vision.config: model_type {vision.get('model_type')!r} is not a vision-language "
                            "family's")
    specials = family_part(family, "family").IMAGE_TOKENS if family else ()
    tokenizer = train_tokenizer(spec.vocab_size, specials)

    from safetensors.numpy import save_file

    with atomic_directory(Path(out_dir)) as tmp:
        write_json(tmp / "config.json", hf_config)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
        write_json(tmp / "tokenizer_config.json", _tokenizer_config(hf_config, tokenizer))
        write_json(tmp / "generation_config.json", _generation_config(hf_config))
        if family:
            family_part(family, "synthetic").write_synthetic(tmp, hf_config, tensors, vision, seed)


def full_hf_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` with every field transformers would otherwise default filled in explicitly."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise LlmbuildError("source.config: missing field 'model_type'")
    arch = get_family(family_for_hf_model_type(model_type))
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        if key not in config:
            raise LlmbuildError(f"source.config: missing field {key!r}")
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    defaults: dict[str, Any] = {
        "architectures": [arch.hf_class],
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "num_key_value_heads": heads,
        "head_dim": hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": SPECIAL_TOKENS.index("<|endoftext|>"),
        "eos_token_id": SPECIAL_TOKENS.index("<|im_end|>"),
        "pad_token_id": SPECIAL_TOKENS.index("<|endoftext|>"),
        "attention_dropout": 0.0,
        "use_cache": True,
        "torch_dtype": "float32",
        # Switch off explicitly what the canonical layout cannot express (attention_bias, ...).
        **{flag: False for flag in arch.hf_unsupported_flags},
    }
    full = defaults | dict(config)
    if isinstance(full["vocab_size"], int) and full["vocab_size"] < _MIN_VOCAB:
        raise LlmbuildError(f"source.config: vocab_size must be at least {_MIN_VOCAB} for a byte-level tokenizer")
    return full


def random_tensors(spec: ModelSpec, seed: int) -> dict[str, np.ndarray]:
    """float32 weights under HF names, drawn in sorted-name order from one generator."""
    rng = np.random.default_rng(seed)
    family = get_family(spec.architecture)
    shapes = {_hf_name(name): (name, shape) for name, shape in expected_shapes(spec).items()}
    tensors = {}
    for hf_name in sorted(shapes):
        name, shape = shapes[hf_name]
        tensors[hf_name] = family.synthetic_tensor(rng, name, shape, spec,
                                                   lambda name=name, shape=shape: _init(rng, name, shape, spec))
    return tensors


def _hf_name(name: str) -> str:
    return name if name.startswith("lm_head.") else "model." + name


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...], spec: ModelSpec) -> np.ndarray:
    if name.endswith("norm.weight"):
        # The final norm feeds the head: its scale sets how far the logits spread.
        scale = LOGIT_STD / (EMBED_STD * np.sqrt(spec.hidden_size)) if name == "norm.weight" else 1.0
        return (scale * (1.0 + rng.uniform(-NORM_SPREAD, NORM_SPREAD, size=shape))).astype(np.float32)
    if name.endswith(".bias"):
        std = BIAS_STD
    elif name in ("embed_tokens.weight", "lm_head.weight"):
        std = EMBED_STD
    else:
        std = LINEAR_GAIN / np.sqrt(shape[1])
    return (std * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)


def train_tokenizer(vocab_size: int, extra_specials: tuple[str, ...] = ()) -> Any:
    """A byte-level BPE with exactly `vocab_size` tokens, trained on the shipped corpus; `extra_specials`
    (a vision model's image tokens) take the places of the last reserved tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    # The trainer breaks count ties by pair order, so its result does not depend on thread count
    # (tests/test_frontend_synthetic.py builds in two processes and compares bytes).
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(extra_specials),
        min_frequency=2,
        special_tokens=[AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [line for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    tokenizer.train_from_iterator(lines, trainer=trainer)
    # A small corpus runs out of merges before a large vocab_size: fill up with reserved tokens so
    # the tokenizer and the embedding agree on the vocabulary size.
    missing = vocab_size - tokenizer.get_vocab_size(with_added_tokens=True) - len(extra_specials)
    tokenizer.add_special_tokens(
        [AddedToken(f"<|reserved_{i}|>", normalized=False, special=True) for i in range(missing)]
        + [AddedToken(t, normalized=False, special=True) for t in extra_specials]
    )
    if tokenizer.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise LlmbuildError(f"source.config: could not build a tokenizer of vocab_size {vocab_size}")
    return tokenizer


def _first_id(value: Any) -> int | None:
    return value[0] if isinstance(value, list) and value else value if isinstance(value, int) else None


def _tokenizer_config(hf_config: Mapping[str, Any], tokenizer: Any) -> dict[str, Any]:
    def token(key: str) -> str | None:
        token_id = _first_id(hf_config.get(key))
        return tokenizer.id_to_token(token_id) if token_id is not None else None

    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "pad_token": token("pad_token_id"),
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": hf_config["max_position_embeddings"],
        "chat_template": CHATML_TEMPLATE,
    }


def _generation_config(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("bos_token_id", "eos_token_id", "pad_token_id")
    return {key: hf_config[key] for key in keys if hf_config.get(key) is not None} | {"do_sample": False}

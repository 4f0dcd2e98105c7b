"""The independent reference: transformers runs the source checkpoint and records what each layer saw.

Written once per recipe to reference.safetensors, so per-layer jobs compare against it without
importing torch. Contents: `ids` [T]; per layer `layers.{i}.input|output` [T, H] and `layers.{i}.k|v`
[T, kv_heads, head_dim] (k after RoPE, as cached), or for a linear-attention layer its state after each
stage's tokens, `layers.{i}.state.{stage}.conv` [K - 1, conv_dim] (the convolution's window) and
`layers.{i}.state.{stage}.recurrent` [Hv, dk, dv]; `logits` [V] at the last position; and the end-to-end greedy run:
`generate.prompt_ids`, `generate.ids` and `generate.logits` [steps, V] (every step's logits, so the end-to-end
check compares every step, not only the first). Floats are stored as float32, the type
transformers computed them in (so nothing is lost); ids as int64.

transformers' model is streamed one decoder layer at a time (verify/stream_model.py), with weights read
per layer or per block of rows (verify/stream_weights.py): memory is one layer in float32, not the model.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.allocator import release_freed_memory
from llmbuild.artifacts.layer_weights import quantized_checkpoint_dir
from llmbuild.artifacts.paths import BuildPaths, read_spec, shapes_of, tokenizer_dir, write_json
from llmbuild.progress_log import StepProgress
from llmbuild.quant.scheme import head_scheme, recipe_scheme
from llmbuild.recipe_types import Recipe
from llmbuild.verify.stage_cases import split_lengths

if TYPE_CHECKING:  # torch is imported only where the reference runs
    from llmbuild.verify.stream_weights import ReferenceWeights

SEED = 20260721


def verification_ids(vocab: int, count: int) -> np.ndarray:
    return np.random.default_rng(SEED).integers(0, vocab, size=count).astype(np.int64)


FIXED_PROMPT_LENGTH = 8  # ids of the end-to-end prompt of a checkpoint without a tokenizer
DEFAULT_PROMPT = "Hello"  # the end-to-end prompt's text when the recipe gives none


def prompt_ids_for(recipe: Recipe, tokenizer: Any, vocab: int) -> list[int]:
    """The end-to-end prompt: `verify.prompt_ids` when given; else `verify.prompt` (default "Hello") through
    the chat template when the tokenizer has one, as plain text when it has none (base models, and most
    checkpoints the quantization libraries write); without tokenizer files, fixed ids."""
    if recipe.verify.prompt_ids:
        return list(recipe.verify.prompt_ids)
    if tokenizer is None:
        return [int(i) for i in verification_ids(vocab, FIXED_PROMPT_LENGTH)]
    text = recipe.verify.prompt or DEFAULT_PROMPT
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
    else:
        ids = tokenizer(text)["input_ids"]
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def reference_weights(recipe: Recipe, paths: BuildPaths) -> ReferenceWeights:
    """The streamed weights of the model the build compiles: the source, a quantized checkpoint's
    dequantized levels, or the source rounded to nearest; lm_head rounded when quantization.lm_head says."""
    from llmbuild.verify.hf_reference import require_reference_libraries

    require_reference_libraries()  # before the modules below import torch
    from llmbuild.verify.stream_rounding import RoundedHead, RoundedProjections
    from llmbuild.verify.stream_weights import GGUFWeights, HFWeights, QuantizedWeights

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    qdir = quantized_checkpoint_dir(recipe, paths)
    source = recipe.source
    weights: ReferenceWeights
    if qdir is not None:
        weights = QuantizedWeights(qdir)
    elif source.kind == "synthetic":
        weights = HFWeights(paths.checkpoint)
    elif source.kind == "hf":
        if not source.path:
            raise LlmbuildError("source: an hf source needs 'path' (a checkpoint directory)")
        weights = HFWeights(Path(source.path))
    elif source.kind == "gguf":
        from llmbuild.frontend.sources import gguf_file

        weights = GGUFWeights(gguf_file(source))
    else:
        raise LlmbuildError(f"source: unknown kind {source.kind!r}: expected synthetic, hf or gguf")
    scheme = recipe_scheme(recipe.quantization)
    if qdir is None and scheme is not None:
        weights = RoundedProjections(weights, scheme)
    head = head_scheme(recipe.quantization)
    if head is not None:
        weights = RoundedHead(weights, head)
    return weights


def make_reference(recipe: Recipe, paths: BuildPaths, out: Path) -> None:
    spec = read_spec(paths.spec)
    shapes = shapes_of(recipe)
    n1, n2 = split_lengths(shapes, recipe.verify.check_tokens)
    ids = verification_ids(spec.vocab_size, n1 + n2 + 1)
    weights = reference_weights(recipe, paths)  # first: it names torch or transformers if one is missing
    from llmbuild.verify.stream_model import streamed_model

    model, store = streamed_model(weights)
    # One line a layer, then one a generated token, in the step's log: a 7B reference runs for minutes.
    # A model with linear-attention layers runs the stages' tokens in three calls, so that the state each
    # stage starts from can be recorded (stage_cases.py); a dense model's cache holds it after one.
    splits = (n1, n2, 1) if "linear" in spec.layer_types else None
    calls = len(splits) if splits else 1
    tensors = layer_outputs(model, ids, StepProgress("reference forward", total=calls * spec.num_layers), splits)
    prompt = prompt_ids_for(recipe, _tokenizer(recipe, paths), spec.vocab_size)
    generated, logits = greedy(model, prompt, recipe.verify.max_new_tokens, spec.eos_token_ids,
                              StepProgress("reference generate", total=recipe.verify.max_new_tokens))
    tensors["generate.prompt_ids"] = np.array(prompt, dtype=np.int64)
    tensors["generate.ids"] = np.array(generated, dtype=np.int64)
    tensors["generate.logits"] = logits
    save_reference(tensors, out)
    # The streamed model's heap, kept for reuse while it ran (allocator.reuse_freed_memory), is given back
    # before the quantizer's library is imported and reads its layers, so that what the library takes comes
    # on top of what this step still holds, not of what the model kept (a 7B's: about 3.3 GB).
    del model, store, tensors, logits
    gc.collect()
    release_freed_memory()
    # The checkpoint's quantized tensors read again by code llmbuild did not write (first and last layer).
    from llmbuild.verify.independent_dequant import independent_dequantization

    write_json(paths.dequant_check, independent_dequantization(recipe, paths))


def layer_outputs(model: Any, ids: np.ndarray, progress: StepProgress | None = None,
                  splits: tuple[int, ...] | None = None) -> dict[str, np.ndarray]:
    """A forward pass over `ids`: `ids`, `logits` at the last position, and each layer's input, output and
    cached k/v; `progress` gets a line as each layer ends. With `splits` (token counts, one a stage), one
    call per split on one cache, and each linear-attention layer's state after each."""
    import torch

    seen: dict[str, list[np.ndarray]] = {}

    def capture(i: int):
        def pre(module, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            seen.setdefault(f"layers.{i}.input", []).append(h[0].detach().numpy().copy())

        def post(module, args, kwargs, output):
            h = output[0] if isinstance(output, tuple) else output
            seen.setdefault(f"layers.{i}.output", []).append(h[0].detach().numpy().copy())
            if progress is not None:
                progress.done(f"layer {i} done")

        return pre, post

    handles = []
    layers = model.get_decoder().layers
    for i, layer in enumerate(layers):
        pre, post = capture(i)
        handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(layer.register_forward_hook(post, with_kwargs=True))
    states: dict[str, np.ndarray] = {}
    try:
        with torch.no_grad():
            if splits is None:
                # Logits at every position, as the whole model computes them (lm_head is row-blocked, so
                # this costs T x vocab floats); only the last is kept.
                result = model(torch.tensor(ids)[None], use_cache=True)
                cache = _cache_of(result)
            else:
                from transformers import DynamicCache

                cache, start = DynamicCache(config=model.config), 0
                for stage, count in zip(("prefill", "prefill_kv", "decode"), splits, strict=True):
                    chunk = torch.tensor(ids[start : start + count])[None]
                    result = model(chunk, cache=cache, use_cache=True,
                                   position_ids=torch.arange(start, start + count)[None])
                    start += count
                    states.update(_linear_states(cache, len(layers), stage))
    finally:
        for h in handles:
            h.remove()
    tensors: dict[str, np.ndarray] = {"ids": ids, "logits": result.logits[0, -1].numpy().copy()}
    tensors.update({name: np.concatenate(parts) for name, parts in seen.items()})
    tensors.update(states)
    for i in range(len(layers)):
        if any(name.startswith(f"layers.{i}.state.") for name in states):
            continue  # a linear-attention layer: no keys or values
        keys, values = _layer_kv(cache, i)
        tensors[f"layers.{i}.k"] = keys[0].transpose(1, 0, 2)  # [kvh, T, d] -> [T, kvh, d]
        tensors[f"layers.{i}.v"] = values[0].transpose(1, 0, 2)
    return tensors


def greedy(model: Any, prompt: list[int], max_new_tokens: int, eos: tuple[int, ...],
           progress: StepProgress | None = None) -> tuple[list[int], np.ndarray]:
    """(new ids, logits of every step [steps, V]) of transformers' greedy `generate` with a KV cache, stopping
    after an id in `eos`. Plain greedy: no generation_config.json setting (repetition_penalty, ...) applies,
    as the compiled model's greedy loop applies none. `progress` gets a line a token (generate runs the
    last decoder layer once per new token)."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=list(eos) or None,
        pad_token_id=eos[0] if eos else 0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    last = model.get_decoder().layers[-1]
    hook = None if progress is None else last.register_forward_hook(lambda *_: progress.done("token generated"))
    try:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), generation_config=config)
    finally:
        if hook is not None:
            hook.remove()
    return [int(i) for i in out.sequences[0, len(prompt) :]], np.stack([step[0].numpy() for step in out.logits])


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def has_tokenizer(directory: Path) -> bool:
    """Whether a checkpoint directory has tokenizer files (else the end-to-end prompt is fixed ids)."""
    return any((directory / name).is_file() for name in TOKENIZER_FILES)


def _tokenizer(recipe: Recipe, paths: BuildPaths) -> Any:
    """transformers' tokenizer of the build's tokenizer files, only when the prompt is text; None when the
    checkpoint has no tokenizer files. For GGUF those are the files llmbuild extracted
    (tests/test_frontend_gguf.py checks them against transformers' own GGUF tokenizer)."""
    if recipe.verify.prompt_ids:
        return None
    directory = tokenizer_dir(recipe, paths)
    if not has_tokenizer(directory):
        return None
    import transformers

    return transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)


def _cache_of(result: Any) -> Any:
    cache = result.get("cache")
    if cache is None:  # `past_key_values` before transformers renamed it (5.24 warns on the old name)
        cache = result.past_key_values
    return cache


def _linear_states(cache: Any, layers: int, stage: str) -> dict[str, np.ndarray]:
    """Each linear-attention layer's state in transformers' cache after `stage`, in the binary's layout: the
    window as its last K - 1 rows [K - 1, conv_dim] (transformers keeps K columns [conv_dim, K], the first
    of which no later output reads) and the recurrent matrix [Hv, dk, dv]."""
    out = {}
    for i in range(layers):
        get_conv = getattr(cache.layers[i], "conv_states", None)
        if get_conv is None:
            continue
        conv = cache.get_conv_state(i)[0].numpy()
        out[f"layers.{i}.state.{stage}.conv"] = np.ascontiguousarray(conv[:, 1:].T)
        out[f"layers.{i}.state.{stage}.recurrent"] = cache.get_recurrent_state(i)[0].numpy().copy()
    return out


def _layer_kv(cache, i: int) -> tuple[np.ndarray, np.ndarray]:
    if hasattr(cache, "layers"):
        layer = cache.layers[i]
        return layer.keys.numpy(), layer.values.numpy()
    k, v = cache[i]
    return k.numpy(), v.numpy()


def save_reference(tensors: dict[str, np.ndarray], out: Path) -> None:
    from safetensors.numpy import save_file

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    save_file({k: np.ascontiguousarray(v) for k, v in sorted(tensors.items())}, str(tmp))
    tmp.replace(out)


def load_reference(path: Path, prefixes: tuple[str, ...] = ("",)) -> dict[str, np.ndarray]:
    """The reference tensors whose names start with one of `prefixes`, read one at a time."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys() if k.startswith(prefixes)}  # noqa: SIM118 (not iterable)

"""The independent reference: transformers runs the source checkpoint and records what each layer saw.

Written once per recipe to reference.safetensors, so per-layer jobs compare against it without
importing torch. Contents: `ids` [T]; per layer `layers.{i}.input|output` [T, H] and `layers.{i}.k|v`
[T, kv_heads, head_dim] (k after RoPE, as cached); `logits` [V] at the last position; and the end-to-end greedy run:
`generate.prompt_ids`, `generate.ids`, `generate.first_logits`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmbuild.build.layer_weights import quantized_checkpoint_dir
from llmbuild.build.paths import BuildPaths, read_spec, shapes_of, tokenizer_dir
from llmbuild.quant.scheme import QUANTIZED_PROJECTIONS, QuantScheme, head_scheme, recipe_scheme
from llmbuild.recipe.schema import Recipe
from llmbuild.verify.stage_cases import split_lengths

SEED = 20260721


def verification_ids(vocab: int, count: int) -> np.ndarray:
    return np.random.default_rng(SEED).integers(0, vocab, size=count).astype(np.int64)


def prompt_ids_for(recipe: Recipe, tokenizer) -> list[int]:
    if recipe.verify.prompt_ids:
        return list(recipe.verify.prompt_ids)
    messages = [{"role": "user", "content": recipe.verify.prompt or "Hello"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def make_reference(recipe: Recipe, paths: BuildPaths, out: Path) -> None:
    import torch
    from safetensors.numpy import save_file

    from llmbuild.verify.hf_reference import load_dequantized_model, load_reference_model

    spec = read_spec(paths.spec)
    shapes = shapes_of(recipe)
    n1, n2 = split_lengths(shapes)
    ids = verification_ids(spec.vocab_size, n1 + n2 + 1)
    qdir = quantized_checkpoint_dir(recipe, paths)
    if qdir is not None:
        model, tokenizer = load_dequantized_model(qdir, tokenizer_dir(recipe, paths))
    else:
        model, tokenizer = load_reference_model(recipe.source, paths.checkpoint)
        scheme = recipe_scheme(recipe.quantization)
        if scheme is not None:
            _use_quantized_weights(model, scheme)
    head = head_scheme(recipe.quantization)
    if head is not None:
        _use_quantized_head(model, head)
    layers = model.model.layers
    seen: dict[str, np.ndarray] = {}

    def capture(i: int):
        def pre(module, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            seen[f"layers.{i}.input"] = h[0].detach().double().numpy()

        def post(module, args, kwargs, output):
            h = output[0] if isinstance(output, tuple) else output
            seen[f"layers.{i}.output"] = h[0].detach().double().numpy()

        return pre, post

    handles = []
    for i, layer in enumerate(layers):
        pre, post = capture(i)
        handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(layer.register_forward_hook(post, with_kwargs=True))
    with torch.no_grad():
        result = model(torch.tensor(ids)[None], use_cache=True)
    for h in handles:
        h.remove()
    cache = result.past_key_values
    tensors: dict[str, np.ndarray] = {"ids": ids, "logits": result.logits[0, -1].double().numpy()}
    tensors.update(seen)
    for i in range(spec.num_layers):
        keys, values = _layer_kv(cache, i)
        tensors[f"layers.{i}.k"] = keys[0].transpose(1, 0, 2)  # [kvh, T, d] -> [T, kvh, d]
        tensors[f"layers.{i}.v"] = values[0].transpose(1, 0, 2)

    prompt = prompt_ids_for(recipe, tokenizer)
    with torch.no_grad():
        first = model(torch.tensor([prompt])).logits[0, -1].double().numpy()
        gen = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=recipe.verify.max_new_tokens,
            do_sample=False,
            eos_token_id=list(spec.eos_token_ids) or None,
            pad_token_id=spec.eos_token_ids[0] if spec.eos_token_ids else 0,
        )
    tensors["generate.prompt_ids"] = np.array(prompt, dtype=np.int64)
    tensors["generate.ids"] = gen[0, len(prompt) :].numpy().astype(np.int64)
    tensors["generate.first_logits"] = first
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    save_file({k: np.ascontiguousarray(v) for k, v in sorted(tensors.items())}, str(tmp))
    tmp.replace(out)


def _use_quantized_weights(model, scheme: QuantScheme) -> None:
    """Quantized in the build: the reference is the source model with each projection replaced by its
    dequantized round-to-nearest weight (rtn is checked bit for bit against an independent numpy
    implementation in tests/test_quant_formats.py), so the checks measure the compiler, not the rounding."""
    import torch

    from llmbuild.build.quantize_layer import quantize_projection

    for layer in model.model.layers:
        for proj in QUANTIZED_PROJECTIONS:
            module = layer.get_submodule(proj)
            w = module.weight.detach().float().numpy()
            module.weight.data = torch.from_numpy(quantize_projection(w, scheme).dequantize().astype(np.float32))


def _use_quantized_head(model, scheme: QuantScheme) -> None:
    """quantization.lm_head: lm_head's weight (the shared embedding table when tied) rounded to nearest."""
    import torch

    from llmbuild.build.quantize_layer import quantize_projection

    module = model.get_output_embeddings()
    w = module.weight.detach().float().numpy()
    module.weight.data = torch.from_numpy(quantize_projection(w, scheme).dequantize().astype(np.float32))
    if model.config.tie_word_embeddings:
        model.get_input_embeddings().weight = module.weight


def _layer_kv(cache, i: int) -> tuple[np.ndarray, np.ndarray]:
    if hasattr(cache, "layers"):
        layer = cache.layers[i]
        return layer.keys.double().numpy(), layer.values.double().numpy()
    k, v = cache[i]
    return k.double().numpy(), v.double().numpy()


def load_reference(path: Path, prefixes: tuple[str, ...] = ("",)) -> dict[str, np.ndarray]:
    """The reference tensors whose names start with one of `prefixes`, read one at a time."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys() if k.startswith(prefixes)}  # noqa: SIM118 (not iterable)

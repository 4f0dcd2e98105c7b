"""What one model family is, in one value: how its HF config and GGUF metadata become a `ModelSpec`, its
tensor layout, the per-tensor fix-ups its checkpoints need, the places its decoder block differs from the
shared one (importer/nets.py calls the hooks), and its transformers class. A variant of a family is
another `Family` value, not new code: every difference between llama, qwen2 and qwen3 is a field here.
A family whose block differs in structure (a norm placement, an activation) subclasses `Family` and
overrides a hook; the shared builder stays in the importer, and the hook sees only `BlockGraph`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from llmbuild import ConfigFieldError, LlmbuildError
from llmbuild.families.spec import ATTENTION_COMPILED, MLP_COMPILED, ModelSpec

# Our readers and transformers agree on these only when the MLP gate is SiLU.
_SUPPORTED_ACTIVATIONS = ("silu",)


class BlockGraph(Protocol):
    """The part of the importer's net builder (importer/graph.py's TopGraph) a family's block hooks may
    use; values are the builder's SSA values, opaque here so that families import nothing of the compiler.
    Float tensors only: `arg` makes a float32 net input, `weight` a float32 constant."""

    def arg(self, name: str, shape: Sequence[int]) -> Any: ...

    def weight(self, name: str, shape: Sequence[int]) -> Any: ...

    def rms_norm(self, x: Any, gamma: Any, eps: float, loc: str) -> Any: ...

    def add(self, a: Any, b: Any, loc: str) -> Any: ...

    def mul(self, a: Any, b: Any, loc: str) -> Any: ...

    def silu(self, x: Any, loc: str) -> Any: ...

    def sigmoid(self, x: Any, loc: str) -> Any: ...

    def softplus(self, x: Any, loc: str) -> Any: ...

    def gather(self, table: Any, indices: Any, loc: str, axis: int = 0) -> Any: ...

    def reshape(self, x: Any, shape: Sequence[int], loc: str) -> Any: ...

    def slice(self, x: Any, axis: int, start: int, end: int, loc: str) -> Any: ...

    def concat(self, xs: Sequence[Any], axis: int, loc: str) -> Any: ...

    def permute(self, x: Any, order: Sequence[int], loc: str) -> Any: ...

    def rope(self, x: Any, cos: Any, sin: Any, loc: str) -> Any: ...

    def attention(self, q: Any, k: Any, v: Any, mask: Any, scale: float, loc: str) -> Any: ...

    def l2_norm(self, x: Any, eps: float, loc: str) -> Any: ...

    def causal_conv1d(self, x: Any, weight: Any, pad: int, loc: str) -> Any: ...

    def gated_delta_rule(self, q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any | None, chunk_size: int,
                         scale: float, loc: str) -> Any: ...


# A projection as the shared builder makes it (float, or over 4/8-bit levels): x, the weight's name within
# the layer (without `.weight`), output and input features, an optional bias, the op's location.
Projection = Callable[[Any, str, int, int, Any, str], Any]


@dataclass(frozen=True)
class StageShapes:
    """What a block hook needs of the stage it builds: tokens in the net (n), the KV cache's rows (S), the
    keys an attention row sees, and the stage's name ("prefill", "prefill_kv" or "decode")."""

    stage: str
    tokens: int
    seq_length: int
    keys: int


@dataclass(frozen=True)
class CostTerm:
    """An elementwise op a family's hook puts in a layer, as the cost model (cost/ops.py) prices it: `kind`
    "add" (one operation per element) or "norm" (an RMSNorm reading `gamma` weights), `width` elements a row."""

    name: str
    kind: str
    width: int
    gamma: int = 0


@dataclass(frozen=True)
class Family:
    name: str  # registry name, also ModelSpec.architecture
    hf_model_types: tuple[str, ...]  # config.json "model_type" values this family reads
    gguf_architectures: tuple[str, ...]  # GGUF "general.architecture" values this family reads
    hf_class: str  # config.json "architectures" entry, e.g. "Qwen2ForCausalLM"
    qkv_bias: bool
    qk_norm: bool
    # transformers' config-class defaults for the fields we read, so a config.json that leaves one
    # out means what it means to transformers (e.g. Qwen3Config's head_dim of 128, not hidden/heads).
    hf_defaults: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # config.json flags that would add weights or behaviour the canonical layout cannot express.
    hf_unsupported_flags: tuple[str, ...] = ()
    # llama.cpp's converter interleaves q/k rows for rotary on these files; we undo it on read.
    gguf_permutes_qk: bool = False
    # float32 roundings a layer's recurrent state takes per token (the default tolerances' error budget,
    # recipe/tolerances.py): a state carried through every token of the sequence adds them on its path.
    recurrence_roundings_per_token: int = 0
    # Where a published upload of this family stores its language model under another prefix than
    # `model.` (a whole vision-language model's): that prefix -> the prefix of its lm_head.
    text_prefixes: Mapping[str, str] = field(default_factory=dict, hash=False)

    # ---- HF config.json -------------------------------------------------------------------------

    def text_config(self, cfg: Mapping[str, Any]) -> dict[str, Any]:
        """The language model's fields of a config.json this family reads: the config itself, unless the
        family publishes a whole model whose language part is nested (Qwen3.5's `qwen3_5`)."""
        return dict(cfg)

    def spec_from_hf_config(self, cfg: Mapping[str, Any], *, origin: str = "config.json") -> ModelSpec:
        """The ModelSpec a HF config describes; LlmbuildError naming `origin` and the field at fault."""

        def get(key: str, default: Any = None) -> Any:
            # An absent key takes the config class's default; an explicit null stays null.
            return cfg[key] if key in cfg else self.hf_defaults.get(key, default)

        def need(key: str) -> int:
            value = get(key)
            if value is None:
                raise ConfigFieldError(f"{origin}: missing field {key!r} (needed for {self.name})", key)
            return _positive_int(value, key, origin)

        act = get("hidden_act") or "silu"
        if act not in _SUPPORTED_ACTIVATIONS:
            raise LlmbuildError(f"{origin}: hidden_act {act!r} is not supported (expected silu)")
        for flag in self.hf_unsupported_flags:
            if cfg.get(flag):
                raise LlmbuildError(f"{origin}: {flag}=true is not supported for {self.name}")

        hidden = need("hidden_size")
        heads = need("num_attention_heads")
        head_dim = get("head_dim")
        if head_dim is None:
            if hidden % heads:
                raise ConfigFieldError(f"{origin}: hidden_size {hidden} is not a multiple of {heads} heads",
                                       "hidden_size")
            head_dim = hidden // heads
        rope_params = cfg.get("rope_parameters") or {}
        rope_theta = cfg.get("rope_theta") or rope_params.get("rope_theta") or get("rope_theta", 10000.0)
        head_dim = _positive_int(head_dim, "head_dim", origin)
        if head_dim % 2:
            split = f" (num_attention_heads {heads} into hidden_size {hidden})" if head_dim * heads == hidden else ""
            raise ConfigFieldError(f"{origin}: head_dim: expected an even head_dim (rotary embeddings turn pairs "
                                   f"of dimensions), got head_dim {head_dim}{split}", "head_dim")
        layers = need("num_hidden_layers")
        _check_layer_types(cfg.get("layer_types"), layers, origin)
        return ModelSpec(
            architecture=self.name,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=_positive_int(get("num_key_value_heads") or heads, "num_key_value_heads", origin),
            head_dim=head_dim,
            intermediate_size=need("intermediate_size"),
            vocab_size=need("vocab_size"),
            rms_norm_eps=_positive_float(get("rms_norm_eps") or 1e-6, "rms_norm_eps", origin),
            rope_theta=_positive_float(rope_theta, "rope_theta", origin),
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            qkv_bias=self.qkv_bias,
            qk_norm=self.qk_norm,
            max_position_embeddings=need("max_position_embeddings"),
            bos_token_id=get("bos_token_id"),
            eos_token_ids=_token_ids(get("eos_token_id")),
            rope_scaling=_flatten_rope_scaling(cfg),
        )

    def transform_hf_tensor(self, name: str, array: np.ndarray, spec: ModelSpec) -> np.ndarray:
        """Hook: a fix-up for an HF tensor under its canonical name (none of ours needs one)."""
        return array

    # ---- GGUF metadata --------------------------------------------------------------------------

    def spec_from_gguf(
        self, metadata: Mapping[str, Any], tensor_names: Collection[str], *, origin: str = "gguf"
    ) -> ModelSpec:
        """The ModelSpec a GGUF file's metadata describes; `tensor_names` are the file's own names."""
        arch = metadata.get("general.architecture")

        def get(key: str, default: Any = None) -> Any:
            value = metadata.get(f"{arch}.{key}")
            return default if value is None else value

        def need(key: str) -> int:
            value = get(key)
            if value is None:
                raise LlmbuildError(f"{origin}: missing metadata {arch}.{key}")
            return _positive_int(value, f"{arch}.{key}", origin)

        hidden = need("embedding_length")
        heads = need("attention.head_count")
        tokens = metadata.get("tokenizer.ggml.tokens")
        vocab = get("vocab_size") or (len(tokens) if tokens is not None else None)
        if vocab is None:
            raise LlmbuildError(f"{origin}: no {arch}.vocab_size and no tokenizer.ggml.tokens")
        # key_length is the attention head size where it differs from hidden/heads (qwen3);
        # llama files state it as the rotary dimension instead.
        head_dim = get("attention.key_length") or get("rope.dimension_count") or hidden // heads
        eos = metadata.get("tokenizer.ggml.eos_token_id")
        return ModelSpec(
            architecture=self.name,
            hidden_size=hidden,
            num_layers=need("block_count"),
            num_heads=heads,
            num_kv_heads=_positive_int(get("attention.head_count_kv", heads), "head_count_kv", origin),
            head_dim=_positive_int(head_dim, "head_dim", origin),
            intermediate_size=need("feed_forward_length"),
            vocab_size=_positive_int(vocab, "vocab_size", origin),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            # llama.cpp leaves output.weight out exactly when the head shares the embedding.
            tie_word_embeddings="output.weight" not in tensor_names,
            qkv_bias=self.qkv_bias,
            qk_norm=self.qk_norm,
            max_position_embeddings=need("context_length"),
            bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=_token_ids(eos),
            rope_scaling=_gguf_rope_scaling(get),
        )

    def transform_gguf_tensor(self, name: str, array: np.ndarray, spec: ModelSpec) -> np.ndarray:
        """Undo llama.cpp's rotary row interleave on q/k (as transformers' GGUF loader does). It only reorders
        rows, so the GGUF reader applies it to a quantized tensor's stored rows, before dequantizing."""
        if not self.gguf_permutes_qk:
            return array
        if ".self_attn.q_proj." in name:
            return unpermute_qk_rows(array, spec.num_heads)
        if ".self_attn.k_proj." in name:
            return unpermute_qk_rows(array, spec.num_kv_heads)
        return array

    # ---- tensor layout --------------------------------------------------------------------------

    def layer_tensor_shapes(self, spec: ModelSpec) -> dict[str, tuple[int, ...]]:
        """Each tensor of one decoder layer (its name after `layers.{i}.`) with its shape, in import order:
        the Llama layout, with q/k/v biases and q/k norms where the spec has them."""
        h, hd = spec.hidden_size, spec.head_dim
        q, kv, ffn = spec.num_heads * hd, spec.num_kv_heads * hd, spec.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {"input_layernorm.weight": (h,)}
        for proj, shape in (("q", (q, h)), ("k", (kv, h)), ("v", (kv, h)), ("o", (h, q))):
            shapes[f"self_attn.{proj}_proj.weight"] = shape
        if spec.qkv_bias:
            shapes |= {"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)}
        if spec.qk_norm:
            shapes |= {"self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,)}
        shapes["post_attention_layernorm.weight"] = (h,)
        shapes |= {"mlp.gate_proj.weight": (ffn, h), "mlp.up_proj.weight": (ffn, h), "mlp.down_proj.weight": (h, ffn)}
        return shapes

    def tensor_shapes_of_layer(self, spec: ModelSpec, layer: int) -> dict[str, tuple[int, ...]]:
        """Layer `layer`'s tensors: `layer_tensor_shapes`, the same for every layer unless a family's layers
        differ (a hybrid of attention kinds)."""
        return self.layer_tensor_shapes(spec)

    def tensor_shapes(self, spec: ModelSpec) -> dict[str, tuple[int, ...]]:
        """Every canonical tensor of `spec` with its shape, in import order (embedding first)."""
        h = spec.hidden_size
        shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (spec.vocab_size, h)}
        for i in range(spec.num_layers):
            per_layer = self.tensor_shapes_of_layer(spec, i)
            shapes |= {f"layers.{i}.{name}": shape for name, shape in per_layer.items()}
        shapes["norm.weight"] = (h,)
        if not spec.tie_word_embeddings:
            shapes["lm_head.weight"] = (spec.vocab_size, h)
        return shapes

    # ---- the decoder block: hooks of importer/nets.py's shared builder ------------------------------

    def check_compiled(self, spec: ModelSpec) -> None:
        """LlmbuildError (one line) for a block the shared builder does not compile."""
        if spec.mlp not in MLP_COMPILED:
            raise LlmbuildError(f"{spec.architecture}: mlp {spec.mlp!r} is not compiled (compiled: "
                                f"{', '.join(MLP_COMPILED)})")
        if spec.attention not in ATTENTION_COMPILED:
            raise LlmbuildError(f"{spec.architecture}: attention {spec.attention!r} is not compiled (compiled: "
                                f"{', '.join(ATTENTION_COMPILED)})")
        if spec.layer_state:
            names = ", ".join(name for name, _ in spec.layer_state)
            raise LlmbuildError(f"{spec.architecture}: per-layer state ({names}) besides the KV cache is not "
                                "compiled")

    def stage_inputs(self, g: BlockGraph, spec: ModelSpec, layer: int, shapes: StageShapes) -> dict[str, Any]:
        """The net inputs a layer's stage takes besides hidden_states, position_ids and attention_mask, by
        name (the memory plan binds each name): the KV history of a stage on top of a cache."""
        if shapes.stage == "prefill":
            return {}
        kv = (1, shapes.seq_length, spec.num_kv_heads, spec.head_dim)
        return {"history_k": g.arg("history_k", kv), "history_v": g.arg("history_v", kv)}

    def mixer(self, g: BlockGraph, x: Any, pos: Any, mask: Any, inputs: Mapping[str, Any],
              spec: ModelSpec, layer: int, shapes: StageShapes, linear: Projection) -> tuple[Any, dict[str, Any]]:
        """The token mixer on the normed stream `x`: (its output, before the residual join; the outputs the
        runtime keeps, by name). Grouped-query attention with RoPE at positions `pos`, q/k biases and norms
        where the spec has them; its new k/v rows are the outputs."""
        n, H, d = shapes.tokens, spec.hidden_size, spec.head_dim
        p = f"layers.{layer}."
        heads = {}
        for proj, count in (("q", spec.num_heads), ("k", spec.num_kv_heads), ("v", spec.num_kv_heads)):
            b = g.weight(f"{p}self_attn.{proj}_proj.bias", (count * d,)) if spec.qkv_bias else None
            y = linear(x, f"self_attn.{proj}_proj", count * d, H, b, f"{p}{proj}_proj")
            heads[proj] = g.reshape(y, (1, n, count, d), f"{p}{proj}_heads")
        if spec.qk_norm:
            for proj in ("q", "k"):
                gamma = g.weight(f"{p}self_attn.{proj}_norm.weight", (d,))
                heads[proj] = g.rms_norm(heads[proj], gamma, spec.rms_norm_eps, f"{p}{proj}_norm")
        cos, sin = rope_rows(g, pos, n, shapes.seq_length, d, p)
        q = g.rope(heads["q"], cos, sin, p + "q_rope")
        k = g.rope(heads["k"], cos, sin, p + "k_rope")
        v = heads["v"]
        keys, values = k, v
        if "history_k" in inputs:
            keys = g.concat([inputs["history_k"], k], 1, p + "k_concat")
            values = g.concat([inputs["history_v"], v], 1, p + "v_concat")
        attn = g.attention(q, keys, values, mask, d**-0.5, p + "attention")
        o = linear(attn, "self_attn.o_proj", H, spec.num_heads * d, None, p + "o_proj")
        return o, {"present_k": k, "present_v": v}

    def synthetic_tensor(self, rng: np.random.Generator, name: str, shape: tuple[int, ...], spec: ModelSpec,
                         draw: Callable[[], np.ndarray]) -> np.ndarray:
        """Hook of the synthetic checkpoint (frontend/synthetic.py): the canonical tensor `name` as the
        checkpoint stores it, drawn from `rng`; `draw()` is the shared draw (the value the block uses)."""
        return draw()

    def residual(self, g: BlockGraph, residual: Any, branch: Any, spec: ModelSpec, prefix: str, part: str) -> Any:
        """The stream after a branch (`part` "attn" or "mlp"): residual + branch. A family with norms or
        scales on the branch output adds them here (its extra weights in `layer_tensor_shapes`)."""
        return g.add(residual, branch, f"{prefix}{part}_residual")

    def residual_cost(self, spec: ModelSpec, part: str) -> tuple[CostTerm, ...]:
        """What `residual` adds to the layer, for the cost model: the one addition."""
        return (CostTerm(f"{part}_residual", "add", spec.hidden_size),)

    def gated_activation(self, g: BlockGraph, gate: Any, up: Any, prefix: str) -> Any:
        """The MLP's gated activation, SiLU(gate) * up."""
        return g.mul(g.silu(gate, prefix + "gate_silu"), up, prefix + "gate_mul")


ROPE_COS, ROPE_SIN = "rope.cos", "rope.sin"  # the RoPE tables [S, rope_dim], weights of the head


def rope_rows(g: BlockGraph, pos: Any, n: int, S: int, width: int, p: str) -> tuple[Any, Any]:
    """The cos and sin rows of positions `pos` ([1, n] ids), as [1, n, 1, width] to broadcast over heads."""
    tables = []
    for name in (ROPE_COS, ROPE_SIN):
        rows = g.gather(g.weight(name, (S, width)), pos, f"{p}{name}_gather")
        tables.append(g.reshape(rows, (1, n, 1, width), f"{p}{name}_heads"))
    return tables[0], tables[1]


def unpermute_qk_rows(array: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: per head it wrote rows (0, d/2, 1, d/2+1, ...) as
    reshape(n_head, 2, d/2).swapaxes(1, 2); we read them back into HF's halves-split order."""
    half = array.shape[0] // n_head // 2
    rows = array.reshape(n_head, half, 2, *array.shape[1:])
    return np.ascontiguousarray(rows.swapaxes(1, 2).reshape(array.shape))


def _positive_int(value: Any, key: str, origin: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ConfigFieldError(f"{origin}: {key} must be a positive integer, got {value!r}", key)
    return int(value)


def _positive_float(value: Any, key: str, origin: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value) or value <= 0:
        raise ConfigFieldError(f"{origin}: {key}: expected a finite number > 0, got {value!r}", key)
    return float(value)


def _check_layer_types(layer_types: Any, layers: int, origin: str) -> None:
    """transformers 5 configs list each layer's attention; every layer here is full causal attention (no
    sliding window is compiled), and the list must agree with num_hidden_layers."""
    if layer_types is None:
        return
    if not isinstance(layer_types, list):
        raise ConfigFieldError(f"{origin}: layer_types: expected a list, got {type(layer_types).__name__}",
                               "layer_types")
    if len(layer_types) != layers:
        raise ConfigFieldError(f"{origin}: layer_types: expected one entry per layer (num_hidden_layers "
                               f"{layers}), got {len(layer_types)}", "layer_types")
    for i, kind in enumerate(layer_types):
        if kind != "full_attention":
            raise ConfigFieldError(f"{origin}: layer_types[{i}]: expected full_attention (the only attention "
                                   f"compiled), got {kind!r}", f"layer_types[{i}]")


def _token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _flatten_rope_scaling(cfg: Mapping[str, Any]) -> tuple[tuple[str, object], ...]:
    """HF's rope_scaling (transformers 4) or rope_parameters less rope_theta (transformers 5), as
    sorted pairs; plain RoPE (no dict, or rope_type "default" alone) is ()."""
    scaling = cfg.get("rope_scaling")
    if not scaling:
        scaling = {k: v for k, v in (cfg.get("rope_parameters") or {}).items() if k != "rope_theta"}
    if not scaling or (set(scaling) <= {"rope_type", "type"} and _rope_type(scaling) == "default"):
        return ()
    return tuple(sorted((str(k), _hashable(v)) for k, v in scaling.items()))


def _rope_type(scaling: Mapping[str, Any]) -> Any:
    return scaling.get("rope_type", scaling.get("type"))


def _gguf_rope_scaling(get: Any) -> tuple[tuple[str, object], ...]:
    kind = get("rope.scaling.type")
    if kind in (None, "none"):
        return ()
    pairs: dict[str, object] = {"rope_type": kind}
    if get("rope.scaling.factor") is not None:
        pairs["factor"] = float(get("rope.scaling.factor"))
    if get("rope.scaling.original_context_length") is not None:
        pairs["original_max_position_embeddings"] = int(get("rope.scaling.original_context_length"))
    return tuple(sorted(pairs.items()))

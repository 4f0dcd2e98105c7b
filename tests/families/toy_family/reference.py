"""The toy family's forward pass in float64 numpy, written from its definition (family.py's docstring),
sharing nothing with llmbuild: the check the compiled binary answers to."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Tensors = Callable[[str], np.ndarray]


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gamma


def rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """Rotary embedding in HF's halves-split layout; x [tokens, heads, dim]."""
    d = x.shape[-1]
    freqs = positions[:, None] * theta ** (-np.arange(0, d, 2) / d)[None, :]
    cos, sin = np.cos(freqs)[:, None, :], np.sin(freqs)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def logits(t: Tensors, config: dict, ids: list[int]) -> np.ndarray:
    """Each position's next-token logits [tokens, vocab] for the whole sequence `ids` (causal)."""
    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    d = config["head_dim"]
    n = len(ids)
    x = t("model.embed_tokens.weight")[ids]
    positions = np.arange(n, dtype=np.float64)
    causal = np.triu(np.full((n, n), -np.inf), k=1)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."

        def linear(v: np.ndarray, name: str, p: str = p) -> np.ndarray:
            return v @ t(f"{p}{name}.weight").T

        a = rms_norm(x, t(p + "input_layernorm.weight"), eps)
        q = rope(linear(a, "self_attn.q_proj").reshape(n, heads, d), positions, theta)
        k = rope(linear(a, "self_attn.k_proj").reshape(n, kv_heads, d), positions, theta)
        v = linear(a, "self_attn.v_proj").reshape(n, kv_heads, d)
        group = heads // kv_heads
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d) + causal
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", weights, v).reshape(n, heads * d)
        x = x + rms_norm(linear(attn, "self_attn.o_proj"), t(p + "attn_output_norm.weight"), eps)
        m = rms_norm(x, t(p + "post_attention_layernorm.weight"), eps)
        gate = linear(m, "mlp.gate_proj")
        mlp = linear(gate / (1 + np.exp(-gate)) * linear(m, "mlp.up_proj"), "mlp.down_proj")
        x = x + rms_norm(mlp, t(p + "mlp_output_norm.weight"), eps)
    head = t("lm_head.weight") if not config["tie_word_embeddings"] else t("model.embed_tokens.weight")
    return rms_norm(x, t("model.norm.weight"), eps) @ head.T


def greedy(t: Tensors, config: dict, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy ids after `prompt` and the logits each was chosen from (recomputed over the whole sequence)."""
    ids, chosen, steps_logits = list(prompt), [], []
    for _ in range(steps):
        row = logits(t, config, ids)[-1]
        steps_logits.append(row)
        chosen.append(int(np.argmax(row)))
        ids.append(chosen[-1])
    return chosen, steps_logits

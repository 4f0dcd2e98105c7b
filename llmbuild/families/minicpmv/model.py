"""MiniCPM-V 2.6's vision path in torch (SigLIP + resampler): the reference of every vision check, and the
static vit net exported to ONNX (reference.py adds the language model).

MiniCPM-V is not native in transformers. Its vision tower is the NaViT-style SigLIP that transformers ships
as `Idefics2VisionTransformer` (used here as it is: the same tensor names under `vpm.`). The resampler is
written below after the published `resampler.py`: `query_num` learned queries attend, in one multi-head
attention, to the tower's rows (projected by `kv_proj`, normalized by `ln_kv`); the keys, not the values,
carry a 2-D sin-cos embedding of the slice's patch grid and padding patches are masked; then `ln_post` and
`x @ proj`. The language model is a Qwen2 (`llm.`), whose embeddings at the `<unk>` placeholder rows are
replaced by the resampler's rows, overview first, then the slices row by row.

Two forms of the vision path exist on purpose:

- `reference_features`: one slice at its own size, no padding: transformers' tower computes its position
  ids from the grid itself, `nn.MultiheadAttention` runs the resampler's attention with the published
  key-padding semantics. This is the independent reference of every check.
- `StaticVision`: what is exported to ONNX: one static graph for slices of any size up to `max_patches`.
  Whatever MiniCPM-V computes from the grid size (the tower's position ids, its padding mask, the
  resampler's key-padding mask and sin-cos table) is an input the host fills per slice
  (inputs.py, runtime.py); the attention is written as the plain softmax(QKᵀ·scale + mask)V the ONNX
  importer fuses, with the packed in-projection of nn.MultiheadAttention split into its q, k, v rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from llmbuild.families import siglip
from llmbuild.families.minicpmv.family import RESAMPLER, STATIC_INPUTS, VPM, read_config, resampler_heads, vit_geometry
from llmbuild.families.minicpmv.inputs import slice_inputs
from llmbuild.frontend.torch_onnx_export import export_tower_onnx
from llmbuild.numerics.sincos import sincos_2d


def build_modules(cfg: dict[str, Any]) -> tuple[Any, Any]:
    """(transformers' Idefics2VisionTransformer, the Resampler) for a MiniCPM-V config, untrained."""
    import torch
    from transformers import Idefics2VisionConfig
    from transformers.models.idefics2.modeling_idefics2 import Idefics2VisionTransformer

    vc = {k: v for k, v in cfg["vision_config"].items() if k not in ("model_type", "architectures")}
    vision_config = Idefics2VisionConfig(**vc)
    vision_config._attn_implementation = "eager"
    tower = Idefics2VisionTransformer(vision_config)
    embed_dim = int(cfg["hidden_size"])

    class Resampler(torch.nn.Module):
        """The published resampler's modules and names (its `adaptive` 2-D position cache is computed on
        demand here: `sincos_2d` of the slice's grid)."""

        def __init__(self) -> None:
            super().__init__()
            self.query = torch.nn.Parameter(torch.zeros(int(cfg["query_num"]), embed_dim))
            self.kv_proj = torch.nn.Linear(vision_config.hidden_size, embed_dim, bias=False)
            self.attn = torch.nn.MultiheadAttention(embed_dim, resampler_heads(embed_dim))
            self.ln_q = torch.nn.LayerNorm(embed_dim, eps=1e-6)
            self.ln_kv = torch.nn.LayerNorm(embed_dim, eps=1e-6)
            self.ln_post = torch.nn.LayerNorm(embed_dim, eps=1e-6)
            self.proj = torch.nn.Parameter(torch.zeros(embed_dim, embed_dim))

    return tower.eval(), Resampler().eval()


def load_vision(model_dir: Path) -> tuple[Any, Any, dict[str, Any]]:
    """(tower, resampler, config) with the checkpoint's `vpm.*` and `resampler.*` tensors, float32."""
    cfg = read_config(model_dir)
    tower, resampler = build_modules(cfg)
    siglip.load_prefixed(model_dir, {VPM: tower, RESAMPLER: resampler})
    return tower, resampler, cfg


def reference_features(tower: Any, resampler: Any, slice_pixels: np.ndarray) -> np.ndarray:
    """[query_num, hidden] for one slice [3, h*patch, w*patch] at its own size: transformers' tower (its
    own position ids from the grid), then the resampler with nn.MultiheadAttention as published."""
    import torch

    patch = tower.config.patch_size
    _, height, width = slice_pixels.shape
    grid_h, grid_w = height // patch, width // patch
    with torch.no_grad():
        pixels = torch.from_numpy(np.ascontiguousarray(slice_pixels, np.float32))[None]
        mask = torch.ones((1, grid_h, grid_w), dtype=torch.bool)
        rows = tower(pixel_values=pixels, patch_attention_mask=mask).last_hidden_state  # [1, h*w, C]
        x = resampler.ln_kv(resampler.kv_proj(rows)).permute(1, 0, 2)  # L, B, D
        pos = torch.from_numpy(sincos_2d(x.shape[-1], grid_h, grid_w).reshape(grid_h * grid_w, 1, -1))
        q = resampler.ln_q(resampler.query)[:, None]  # Q, B, D
        padding = torch.zeros((1, grid_h * grid_w), dtype=torch.bool)
        out = resampler.attn(q, x + pos, x, key_padding_mask=padding, need_weights=False)[0]
        out = resampler.ln_post(out.permute(1, 0, 2)) @ resampler.proj
    return out[0].numpy()


def static_vision(model_dir: Path) -> tuple[Any, dict[str, Any]]:
    """(the module the vit net is exported from, its config): inputs `STATIC_INPUTS`, for pieces padded to
    the net's capacity and laid out as MiniCPM-V lays them, [1, 3, patch, capacity * patch] (the example
    inputs of the export fix the capacity: `vit_geometry`'s max_patches)."""
    import torch

    tower, resampler, cfg = load_vision(model_dir)

    class StaticVision(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tower, self.resampler = tower, resampler

        def forward(self, pixel_values: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                    resampler_mask: torch.Tensor, pos_embed: torch.Tensor) -> torch.Tensor:
            emb = self.tower.embeddings
            x = emb.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
            x = x + emb.position_embedding(position_ids)
            x = self.tower.encoder(inputs_embeds=x, attention_mask=attention_mask).last_hidden_state
            x = self.tower.post_layernorm(x)
            r = self.resampler
            kv = r.ln_kv(r.kv_proj(x))  # [1, N, D]
            q = r.ln_q(r.query)[None]  # [1, Q, D]
            return r.ln_post(self.attention(q, kv + pos_embed, kv, resampler_mask)) @ r.proj

        def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            # nn.MultiheadAttention's packed in-projection, its q, k and v rows apart.
            attn = self.resampler.attn
            d, heads = attn.embed_dim, attn.num_heads
            w, b = attn.in_proj_weight, attn.in_proj_bias
            qh, kh, vh = (torch.nn.functional.linear(t, w[i * d:(i + 1) * d], b[i * d:(i + 1) * d])
                          .view(1, t.shape[1], heads, d // heads).transpose(1, 2)
                          for i, t in enumerate((q, k, v)))
            scores = torch.matmul(qh, kh.transpose(2, 3)) * (d // heads) ** -0.5 + mask
            out = torch.matmul(torch.softmax(scores, dim=-1), vh).transpose(1, 2).reshape(1, q.shape[1], d)
            return attn.out_proj(out)

    return StaticVision().eval(), cfg


def export_onnx(model_dir: Path, out: Path, exporter: str = "legacy") -> Path:
    """Write the static vit net's source graph (tower + resampler, inputs `STATIC_INPUTS`) to `out`."""
    import torch

    geo = vit_geometry(read_config(model_dir))
    module, _ = static_vision(model_dir)
    piece = np.zeros((3, geo["patch"], geo["patch"]), np.float32)  # any piece: the shapes are static
    example = slice_inputs(piece, geo["patch"], geo["max_patches"], geo["side"], geo["queries"], geo["embed_dim"])
    args = tuple(torch.from_numpy(example[name]) for name in STATIC_INPUTS)
    return export_tower_onnx(module, args, out, list(STATIC_INPUTS), exporter)



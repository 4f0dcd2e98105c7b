"""MiniCPM-V 4.6's vision path in torch: transformers' own modules (`MiniCPMV4_6VisionModel`, the tower with its
window-attention merger, and `MiniCPMV4_6Merger`), and the static vit net exported from them to ONNX.

`StaticVision` computes what transformers' `get_image_features` computes for one piece, on the pieces' inputs
of inputs.slice_inputs: patches in merge order, padded to the net's capacity. Everything that transformers
derives from the grid at run time (position ids, window indices, the per-image attention spans) is an input
the host fills, so one graph serves every grid; the attention is written as the plain
softmax(QKᵀ·scale + mask)V the ONNX importer fuses, and a window's mean as four slices added and scaled (the
importer has no reduction).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from llmbuild.families import siglip
from llmbuild.families.minicpmv4_6.family import ROWS_DIVISOR, model_config_fields, read_config, vit_geometry
from llmbuild.families.minicpmv4_6.inputs import INPUTS, slice_inputs
from llmbuild.frontend.torch_onnx_export import export_tower_onnx

TOWER, MERGER = "model.vision_tower.", "model.merger."


def load_vision(model_dir: Path) -> tuple[Any, Any, dict[str, Any]]:
    """(transformers' tower, its merger, config) with the checkpoint's tensors, float32, eager attention."""
    import transformers
    from transformers.models.minicpmv4_6 import modeling_minicpmv4_6 as native

    cfg = read_config(model_dir)
    config = transformers.MiniCPMV4_6Config(**model_config_fields(cfg))
    config.vision_config._attn_implementation = "eager"
    tower = native.MiniCPMV4_6VisionModel(config.vision_config).eval()
    merger = native.MiniCPMV4_6Merger(config).eval()
    siglip.load_prefixed(model_dir, {TOWER: tower, MERGER: merger})
    return tower, merger, cfg


def static_vision(model_dir: Path) -> tuple[Any, dict[str, Any]]:
    """(the module the vit net is exported from, its config): inputs `inputs.INPUTS`, output the merged rows
    [1, capacity / 16, text width] (the first h*w/16 are the piece's)."""
    import torch

    tower, merger, cfg = load_vision(model_dir)
    insert = int(cfg.get("insert_layer_id", 6))

    def attention(attn: Any, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        heads = attn.num_heads
        q, k, v = (proj(x).view(b, t, heads, d // heads).transpose(1, 2)
                   for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        scores = torch.matmul(q, k.transpose(2, 3)) * attn.scaling + mask
        out = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, t, d)
        return attn.out_proj(out)

    def layer(mod: Any, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + attention(mod.self_attn, mod.layer_norm1(x), mask)
        return x + mod.mlp(mod.layer_norm2(x))

    def window_merge(mod: Any, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + attention(mod.self_attn, mod.layer_norm1(x), mask)
        b, t, d = x.shape
        flat = x.reshape(b, t // 4, 4 * d)  # each window's four rows, concatenated in order
        mean = (flat[..., :d] + flat[..., d:2 * d] + flat[..., 2 * d:3 * d] + flat[..., 3 * d:]) * 0.25
        h = mod.linear_2(mod.act(mod.linear_1(mod.pre_norm(flat))))
        return h + mean

    class StaticVision(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tower, self.merger = tower, merger

        def forward(self, pixel_values: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                    window_mask: torch.Tensor, merged_mask: torch.Tensor) -> torch.Tensor:
            emb = self.tower.embeddings
            x = emb.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
            x = x + emb.position_embedding(position_ids)
            mask = attention_mask
            for i, mod in enumerate(self.tower.encoder.layers):
                x = layer(mod, x, mask)
                if i == insert:
                    x = window_merge(self.tower.vit_merger, x, window_mask)
                    mask = merged_mask
            x = self.tower.post_layernorm(x)
            b, t, d = x.shape
            # the merger's MLP as MiniCPMV4_6DownsampleMLP runs it, on [1, rows, 4d] (its own view to 2-D rows
            # would export as a Gemm)
            mlp = self.merger.mlp[0]
            return mlp.linear_2(mlp.act(mlp.linear_1(mlp.pre_norm(x.reshape(b, t // 4, 4 * d)))))

    return StaticVision().eval(), cfg


def reference_features(tower: Any, merger: Any, piece: np.ndarray) -> np.ndarray:
    """[h*w/16, text width] for one piece [3, h*patch, w*patch] at its own size, by transformers' own tower and
    merger as get_image_features runs them (NaViT-packed pixels, target_sizes)."""
    import torch

    patch = tower.config.patch_size
    _, height, width = piece.shape
    gh, gw = height // patch, width // patch
    packed = piece.reshape(3, gh, patch, gw, patch).transpose(0, 2, 1, 3, 4).reshape(1, 3, patch, -1)
    sizes = torch.tensor([[gh, gw]], dtype=torch.int32)
    with torch.no_grad():
        out = tower(torch.from_numpy(np.ascontiguousarray(packed, np.float32)), target_sizes=sizes)
        rows = merger(out.last_hidden_state, sizes // 2)[0]
    assert rows.shape[0] == gh * gw // ROWS_DIVISOR
    return rows.numpy()


def export_onnx(model_dir: Path, out: Path, exporter: str = "legacy") -> Path:
    """Write the static vit net's source graph (inputs `inputs.INPUTS`) to `out`."""
    import torch

    geo = vit_geometry(read_config(model_dir))
    module, _ = static_vision(model_dir)
    p = geo["patch"]
    piece = np.zeros((3, 4 * p, 4 * p), np.float32)  # any piece: the shapes are static
    example = slice_inputs(piece, p, geo["capacity"], geo["side"])
    args = tuple(torch.from_numpy(example[name]) for name in INPUTS)
    return export_tower_onnx(module, args, out, list(INPUTS), exporter)

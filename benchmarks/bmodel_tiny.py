"""Every shipped tiny text recipe's bmodel on the vendor's BM1684X and BM1688 cmodels, against transformers and
against the recipe's own `.llmb`, in one table; and a gptqmodel act-order checkpoint compiled with
`llmbuild compile --quantize auto`, beside `llm_convert` on the same checkpoint when the incumbent is set up.

    python benchmarks/bmodel_tiny.py [--build-dir DIR] [--chips bm1684x,bm1688] [--incumbent ENV_SH]

Per recipe and chip: the greedy ids the bmodel generates on the cmodel (16 or up to EOS) equal to
transformers' `generate` and to the `.llmb`'s; in the reference's context (teacher-forced), the steps where
the bmodel picks another token than transformers, with transformers' top-2 logit gap there; the worst cosine
of any net's output against the reference; the build's verdict (recipe tolerances).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXT_RECIPES = ("qwen2_tiny_f32", "qwen2_tiny_bf16", "qwen2_tiny_w4_rtn", "qwen2_tiny_w4", "llama_tiny_f32",
                "llama_tiny_f16", "llama_tiny_w8_rtn", "llama_tiny_w4_awq", "qwen3_tiny_f32")
FIXTURE = ROOT / "tests" / "fixtures" / "quant" / "gptq_asym_actorder_g32"


def build(recipes: Path, build_dir: Path, target: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, LLMBUILD_RECIPES=str(recipes), LLMBUILD_BUILD_DIR=str(build_dir), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--keep-going", target, "--config",
                           "bmodel=true"], cwd=ROOT, env=env, capture_output=True, text=True)


def recipe_rows(build_dir: Path, chips: list[str]) -> list[str]:
    recipes = build_dir / "recipes"
    shutil.rmtree(recipes, ignore_errors=True)
    shutil.copytree(ROOT / "recipes", recipes)
    names = []
    for base in TEXT_RECIPES:
        for chip in chips:
            name = f"{base}_{chip}"
            (recipes / f"{name}.yaml").write_text(f"base: {base}\ntarget:\n  chip: {chip}\n")
            names.append((base, chip, name))
    for _, _, name in names:
        build(recipes, build_dir, name)
    lines = ["| recipe | chip | ids = transformers | ids = .llmb | teacher-forced differing (gap) | worst net cosine "
             "| verified |", "|---|---|---|---|---|---|---|"]
    for base, chip, name in names:
        out = build_dir / name
        checks_path, e2e_path, verify_path = out / "bmodel.json", out / "e2e.json", out / "verify.json"
        if not checks_path.is_file():
            lines.append(f"| {base} | {chip} | build failed | | | | |")
            continue
        checks = json.loads(checks_path.read_text())
        e2e = checks["end_to_end"]
        llmb = json.loads(e2e_path.read_text())["ids"] if e2e_path.is_file() else []
        n = len(e2e["ids"])
        same_llmb = e2e["ids"] == llmb[:n]
        forced = ", ".join(f"step {d['step']} ({d['reference_top2_gap']})" for d in e2e["teacher_forced_differing"])
        worst = min(s["cosine"] for net in checks["nets"].values() for s in net.get("outputs", {}).values())
        verified = json.loads(verify_path.read_text())["passed"] if verify_path.is_file() else False
        equal = "yes" if e2e["tokens_equal"] else f"from step {e2e['first_difference']}"
        lines.append(f"| {base} | {chip} | {equal} ({n}) | {'yes' if same_llmb else 'no'} | {forced or 'none'} "
                     f"| {worst:.7f} | {verified} |")
    return lines


def gptq_rows(work: Path, incumbent: Path | None) -> list[str]:
    """The act-order checkpoint through `llmbuild compile --quantize auto`, and through llm_convert."""
    sys.path.insert(0, str(ROOT / "tests"))
    import numpy as np
    from helpers import library_dequantized_greedy

    from llmbuild.runtime.bmodel_cmodel import CmodelRuntime
    from llmbuild.runtime.bmodel_generate import BmodelLM
    from llmbuild.vendor_toolchain import locate

    out = work / "gptq_act"
    subprocess.run([sys.executable, "-m", "llmbuild.cli", "compile", str(FIXTURE), "--quantize", "auto",
                    "--seq-length", "64", "-o", str(out)], check=True, capture_output=True)
    prompt = [3, 14, 15, 92, 65, 35, 89, 79]
    want, logits = library_dequantized_greedy(FIXTURE, work / "dequantized", prompt, 16)
    gaps = [float(np.sort(row)[-1] - np.sort(row)[-2]) for row in logits]
    binaries = [("llmbuild", out / "gptq_act.bmodel")]
    if incumbent is not None:
        conv = work / "llm_convert"
        done = subprocess.run(["bash", "-c", f"source {incumbent} && llm_convert -m {FIXTURE} -s 64 -q w4bf16 "
                               f"-g 32 -c bm1684x -o {conv}"], capture_output=True, text=True)
        found = sorted(conv.glob("*.bmodel"))
        binaries.append(("llm_convert", found[0] if done.returncode == 0 and found else None))
    lines = ["", "gptqmodel, 4-bit, group 32, asymmetric, act order (tests/fixtures/quant/gptq_asym_actorder_g32), "
             "BM1684X cmodel, 16 steps in the context of transformers on gptqmodel's own dequantization:", "",
             "| compiler | picks equal | differing steps (transformers' top-2 gap) |", "|---|---|---|"]
    for tool, path in binaries:
        if path is None:
            lines.append(f"| {tool} | conversion failed | |")
            continue
        with CmodelRuntime(locate().lib, "bm1684x") as rt:
            rt.load(path)
            picks = BmodelLM(rt).teacher_forced(prompt, want)
        differing = [(k, round(gaps[k], 4)) for k, (p, t) in enumerate(zip(picks, want, strict=True)) if p != t]
        lines.append(f"| {tool} | {len(want) - len(differing)}/{len(want)} | "
                     f"{', '.join(f'step {k} ({g})' for k, g in differing) or 'none'} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", type=Path, default=None)
    ap.add_argument("--chips", default="bm1684x,bm1688")
    ap.add_argument("--incumbent", type=Path, default=None, help="env.sh of benchmarks/incumbent/setup.sh")
    ap.add_argument("--skip-recipes", action="store_true")
    args = ap.parse_args()
    work = args.build_dir or Path(tempfile.mkdtemp(prefix="bmodel_tiny_"))
    work.mkdir(parents=True, exist_ok=True)
    lines = [] if args.skip_recipes else recipe_rows(work, args.chips.split(","))
    lines += gptq_rows(work, args.incumbent)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

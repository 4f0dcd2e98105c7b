"""Decode speed and first-token latency of the host path against transformers eager, in the same run:

    python benchmarks/host_speed.py [--tokens 64] [--repeats 3] [--faithful]

SmolLM2-135M-Instruct bf16 (built with Snakemake first if its binary is missing). Both answer the same chat
prompt greedily for --tokens tokens (EOS ignored, so every run decodes the same count); each figure is the
best of --repeats runs after one warm-up (these VMs share cores: the best run is the least disturbed one).
transformers runs the same checkpoint (`load_reference_model`: float32, eager PyTorch, its default
attention) with a KV cache, one forward per token. Only bf16 is measured: the w4 modes come with a later
issue. `--faithful` adds the simulated device (slow: it is the verification path).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from llmbuild.build.paths import build_root  # noqa: E402

RECIPE = "smollm2_135m_bf16"
PROMPT = "What is the capital of France?"
ROOT = Path(__file__).resolve().parents[1]


def binary() -> Path:
    path = build_root() / RECIPE / f"{RECIPE}.llmb"
    if not path.is_file():
        print(f"# building {RECIPE} (snakemake --cores 2 {RECIPE})", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", RECIPE], cwd=ROOT, check=True)
    return path


def llmbuild_run(path: Path, faithful: bool, tokens: int, repeats: int) -> tuple[float, float]:
    """(first-token latency s, decode tokens/s) of Session.generate: the path `llmbuild run/chat` takes."""
    from llmbuild.runtime.session import Session

    session = Session(path, faithful=faithful, ignore_eos=True)
    prompt = session.tokenizer.chat_ids([{"role": "user", "content": PROMPT}])
    session.generate(prompt, 4)  # warm-up: weights decoded, programs resolved
    best = (float("inf"), 0.0)
    for _ in range(repeats):
        session.reset()
        session.generate(prompt, tokens)
        r = session.last_reply
        assert r is not None and len(r.ids) == tokens
        best = (min(best[0], r.first_token_s), max(best[1], r.tokens_per_s))
    return best


def transformers_run(tokens: int, repeats: int) -> tuple[float, float]:
    import torch

    from llmbuild.recipe import load_recipe
    from llmbuild.verify.hf_reference import load_reference_model

    model, tokenizer = load_reference_model(load_recipe(RECIPE).source, build_root() / RECIPE / "checkpoint")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]

    def once(n: int) -> tuple[float, float]:
        with torch.inference_mode():
            start = time.perf_counter()
            out = model(ids, use_cache=True)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            first = time.perf_counter()
            cache = out.past_key_values
            for _ in range(n - 1):
                out = model(token, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                token = out.logits[:, -1].argmax(-1, keepdim=True)
            end = time.perf_counter()
        return first - start, (n - 1) / (end - first)

    once(4)
    runs = [once(tokens) for _ in range(repeats)]
    return min(r[0] for r in runs), max(r[1] for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--faithful", action="store_true", help="also time the simulated device (slow)")
    args = ap.parse_args()

    import torch

    path = binary()
    rows = [("llmbuild host path (numpy)", *llmbuild_run(path, False, args.tokens, args.repeats))]
    rows.append(("transformers eager (torch, f32)", *transformers_run(args.tokens, args.repeats)))
    if args.faithful:
        rows.append(("llmbuild faithful device", *llmbuild_run(path, True, min(args.tokens, 16), 1)))

    blas = os.environ.get("OPENBLAS_NUM_THREADS", "default")
    print(f"SmolLM2-135M-Instruct bf16 binary ({path}); prompt: {PROMPT!r} (chat template), "
          f"{args.tokens} greedy tokens, best of {args.repeats}; numpy {np.__version__} "
          f"(OPENBLAS_NUM_THREADS={blas}), torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"{os.cpu_count()} CPUs")
    print()
    print("| path | first-token latency (s) | decode tokens/s |")
    print("|---|---:|---:|")
    for name, first, tps in rows:
        print(f"| {name} | {first:.3f} | {tps:.1f} |")
    host, hf = rows[0], rows[1]
    print(f"| host / transformers | {host[1] / hf[1]:.2f}x | {host[2] / hf[2]:.2f}x |")
    print()
    print("w4 (4-bit weights): not measured here; quantized modes come with a later issue.")


if __name__ == "__main__":
    main()

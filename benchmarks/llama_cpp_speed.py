"""llama.cpp's first-token latency and decode speed on a GGUF file, for the host-speed benchmarks' llama.cpp rows.

The prompt is given as token ids (the other rows' chat prompt, so llama.cpp's tokenizer plays no part). One run:
the prompt evaluated in one batch and the first token sampled greedily (the first-token latency), then N - 1
greedy tokens one at a time (decode tokens/s over them); EOS is ignored, so every run decodes N tokens. Each
figure is the best of R runs after a warm-up run, at n_threads 1 and at the machine's CPU count (both for the
prompt's batch and for decode); the faster decode is llama.cpp's best and its thread count is named. Each
thread count runs in its own process (libllama's OpenMP runtime stays out of the process that times llmbuild
and torch), which reports its peak resident memory: the GGUF's pages read through the memory map included.

    python benchmarks/llama_cpp_speed.py MODEL.gguf --ids 1,2,3 [--tokens 64] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from llama_cpp_gguf import VERSION


def llama_cpp_best(gguf: Path, prompt_ids: list[int], tokens: int, repeats: int) -> dict:
    """The faster (by decode tokens/s) of n_threads 1 and the CPU count: path label, first_token_s, tokens_per_s,
    ids, peak_rss_mib, threads (and the slower setting's figures under `other`)."""
    runs = [_child(gguf, prompt_ids, tokens, repeats, threads) for threads in sorted({1, os.cpu_count() or 1})]
    best = max(runs, key=lambda r: r["tokens_per_s"])
    best["other"] = [r for r in runs if r is not best]
    return best


def _child(gguf: Path, prompt_ids: list[int], tokens: int, repeats: int, threads: int) -> dict:
    cmd = [sys.executable, __file__, str(gguf), "--ids", ",".join(map(str, prompt_ids)), "--tokens", str(tokens),
           "--repeats", str(repeats), "--threads", str(threads)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        raise RuntimeError(f"llama.cpp on {gguf.name}, {threads} threads: {lines[-1] if lines else result.returncode}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def time_here(gguf: Path, prompt_ids: list[int], tokens: int, repeats: int, threads: int) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(str(gguf), n_ctx=len(prompt_ids) + tokens + 16, n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    vocab = llm.n_vocab()
    if max(prompt_ids) >= vocab:
        sys.exit(f"{gguf}: prompt id {max(prompt_ids)} is outside the GGUF's vocabulary of {vocab}")
    sampler = llama_cpp.llama_sampler_init_greedy()

    def next_token() -> int:
        return int(llama_cpp.llama_sampler_sample(sampler, llm.ctx, -1))

    def once(n: int) -> tuple[float, float, list[int]]:
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt_ids)
        got = [next_token()]
        first = time.perf_counter()
        for _ in range(n - 1):
            llm.eval(got[-1:])
            got.append(next_token())
        end = time.perf_counter()
        return first - start, (n - 1) / (end - first), got

    once(4)  # warm-up: the file's pages read, weights repacked for this CPU's kernels
    runs = [once(tokens) for _ in range(repeats)]
    llama_cpp.llama_sampler_free(sampler)
    label = f"llama.cpp (llama-cpp-python {VERSION}, {threads} thread{'s' if threads > 1 else ''})"
    return {"path": label, "threads": threads, "first_token_s": min(r[0] for r in runs),
            "tokens_per_s": max(r[1] for r in runs), "ids": runs[0][2],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--ids", required=True, help="the prompt's token ids, comma-separated")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    if not args.gguf.is_file():
        sys.exit(f"{args.gguf}: GGUF file not found")
    try:
        ids = [int(i) for i in args.ids.split(",")]
    except ValueError:
        sys.exit(f"--ids: expected comma-separated token ids, got {args.ids!r}")
    if args.tokens < 2 or args.repeats < 1 or args.threads < 1:
        sys.exit("--tokens must be at least 2, --repeats and --threads at least 1")
    print(json.dumps(time_here(args.gguf, ids, args.tokens, args.repeats, args.threads)))


if __name__ == "__main__":
    main()

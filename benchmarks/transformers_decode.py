"""transformers' decode speed on the model a recipe builds, at its best, next to llmbuild's host path:

    python benchmarks/transformers_decode.py qwen2_7b_w4 [--tokens 8] [--prompt TEXT]

The same checkpoint the recipe reads, loaded whole into transformers' model in bfloat16 (its weights'
own dtype for a float checkpoint; for a quantized one, the dequantized levels, exact in bf16 only up to
the scale's rounding, which does not matter for speed), one forward per token with a KV cache, at torch's
default thread count and on one thread: the faster is transformers' best. bf16 is the only dtype a 7B
model fits a 24 GiB host in (float32: 30 GB), and this CPU's AVX512-BF16 makes it the fastest besides.
Then `llmbuild run` on the recipe's binary (host path), timed by the runtime itself; both report their
peak resident memory (whole process). Run it on an otherwise idle machine: the bf16 model holds ~15 GB.
llama.cpp answers the same prompt ids for as many tokens, on the checkpoint the recipe reads converted to a bf16
GGUF and that quantized by llama.cpp to Q4_0 (benchmarks/llama_cpp_gguf.py; made once, kept under
build/<recipe>/llama_cpp/), before transformers loads its model so the two never share the memory; its rows
are skipped with a one-line note when llama-cpp-python is not installed (benchmarks/llama_cpp/setup.sh) or
the GGUF cannot be made.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def load_bf16(recipe_name: str):
    """transformers' causal LM in bf16 holding the recipe's weights, filled one layer at a time (the
    float32 weights of one layer at most exist at once)."""
    import torch
    import transformers
    from dequantized_checkpoint import vocabulary_tables

    from llmbuild.artifacts.paths import BuildPaths
    from llmbuild.recipe import load_recipe
    from llmbuild.verify.reference import reference_weights

    recipe = load_recipe(recipe_name)
    weights = reference_weights(recipe, BuildPaths.of(recipe))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(weights.config, dtype=torch.bfloat16)
    decoder = model.get_decoder()
    for i, layer in enumerate(decoder.layers):
        keys = list(layer.state_dict())
        layer.load_state_dict({k: v.to(torch.bfloat16) for k, v in weights.layer(i, keys).items()}, assign=True)
    embed, head = vocabulary_tables(weights)
    decoder.embed_tokens.load_state_dict({"weight": embed}, assign=True)
    model.lm_head.load_state_dict({"weight": embed if head is None else head}, assign=True)
    decoder.norm.load_state_dict({"weight": weights.norm().to(torch.bfloat16)}, assign=True)
    decoder.rotary_emb = type(decoder.rotary_emb)(config=model.config)
    return model.eval(), recipe


def transformers_rows(recipe_name: str, prompt_ids: list[int], tokens: int) -> list[dict]:
    import torch

    model, _ = load_bf16(recipe_name)
    ids = torch.tensor([prompt_ids])

    def once(n: int) -> tuple[float, float, list[int]]:
        with torch.inference_mode():
            start = time.perf_counter()
            out = model(ids, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            first = time.perf_counter()
            got = [int(token)]
            for _ in range(n - 1):
                out = model(token, past_key_values=out.past_key_values, use_cache=True)
                token = out.logits[:, -1].argmax(-1, keepdim=True)
                got.append(int(token))
            end = time.perf_counter()
        return first - start, (n - 1) / (end - first), got

    rows = []
    default = torch.get_num_threads()
    for threads in sorted({default, 1}, reverse=True):
        torch.set_num_threads(threads)
        first, tps, got = once(tokens)
        rows.append({"path": f"transformers (torch bf16, {threads} thread{'s' if threads > 1 else ''})",
                     "first_token_s": first, "tokens_per_s": tps, "ids": got})
    torch.set_num_threads(default)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for r in rows:
        r["peak_rss_mib"] = peak
    return rows


def llmbuild_row(recipe_name: str, prompt_ids: list[int], tokens: int) -> dict:
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "llmbuild.cli", "run", recipe_name, "--prompt-ids",
           ",".join(map(str, prompt_ids)), "--max-new-tokens", str(tokens), "--ignore-eos", "--json", "--timing"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    reply = json.loads(result.stdout.strip().splitlines()[-1])
    rss = next(int(line.split()[-1]) for line in result.stderr.splitlines() if "Maximum resident" in line)
    return {"path": "llmbuild run (host path)", "load_s": reply["load_s"],
            "first_token_s": reply["first_token_s"],
            "tokens_per_s": reply["tokens_per_s"], "ids": reply["ids"], "peak_rss_mib": rss / 1024}


def llama_cpp_rows(recipe_name: str, prompt_ids: list[int], tokens: int) -> tuple[list[dict], list[str]]:
    """llama.cpp's best on the recipe's weights as bf16 and Q4_0 GGUFs (one run each after a warm-up, as
    transformers gets one), and notes: why there are no rows, or what the GGUFs hold."""
    from llama_cpp_gguf import missing, recipe_ggufs
    from llama_cpp_speed import llama_cpp_best

    note = missing()
    if note is not None:
        return [], [note]
    try:
        files, made_from = recipe_ggufs(recipe_name, ("q4_0",))
    except RuntimeError as e:
        return [], [f"llama.cpp rows skipped: {e}"]
    rows = []
    for kind, gguf in files.items():
        r = llama_cpp_best(gguf, prompt_ids, tokens, 1)
        r["path"] = (f"llama.cpp ({kind} GGUF; {r['threads']} thread{'s' if r['threads'] > 1 else ''}, the faster "
                     f"of 1 and {os.cpu_count()})")
        r["kind"] = kind
        rows.append(r)
    return rows, [made_from] if made_from else []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--prompt", default="What is the capital of France?")
    ap.add_argument("--record", type=Path, help="also write the table as a benchmark record (benchmarks/records.py)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from llmbuild.artifacts.paths import BuildPaths, tokenizer_dir
    from llmbuild.recipe import load_recipe
    from llmbuild.runtime.tokenizer import BinaryTokenizer  # noqa: F401 (the runtime's own chat template)
    from llmbuild.verify.reference import prompt_ids_for

    recipe = load_recipe(args.recipe)
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir(recipe, BuildPaths.of(recipe)),
                                                     local_files_only=True)
    vocab = len(tok)
    if recipe.verify.prompt_ids or recipe.verify.prompt == args.prompt:  # the recipe's own end-to-end prompt
        prompt = prompt_ids_for(recipe, tok, vocab)
    else:
        ids = tok.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                      tokenize=True)
        prompt = [int(i) for i in (ids["input_ids"] if hasattr(ids, "keys") else ids)]  # a dict in transformers 5
    ours = llmbuild_row(args.recipe, prompt, args.tokens)
    llama, notes = llama_cpp_rows(args.recipe, prompt, args.tokens)  # before transformers holds its model
    theirs = transformers_rows(args.recipe, prompt, args.tokens)
    best = max(theirs, key=lambda r: r["tokens_per_s"])
    ratios = [("best transformers", best), *((f"llama.cpp {r['kind']}", r) for r in llama)]
    print(f"{args.recipe}: {len(prompt)}-token prompt, {args.tokens} greedy tokens")
    print("| path | first-token latency (s) | decode tokens/s | peak RSS MiB | ids |")
    print("|---|---:|---:|---:|---|")
    for r in (ours, *theirs, *llama):
        print(f"| {r['path']} | {r['first_token_s']:.2f} | {r['tokens_per_s']:.3f} | {r['peak_rss_mib']:.0f} | "
              f"{r['ids']} |")
    for label, r in ratios:
        print(f"| llmbuild / {label} | {ours['first_token_s'] / r['first_token_s']:.2f}x | "
              f"{ours['tokens_per_s'] / r['tokens_per_s']:.2f}x | | |")
    load_note = (f"llmbuild's first token is timed after its load ({ours['load_s']:.2f} s: the binary opened and the "
                 "weights its nets read brought into memory), as transformers' is after its model is built and "
                 "llama.cpp's after its GGUF is loaded")
    for note in (*notes, load_note):
        print(f"\n{note}")
    if args.record:
        from records import write_record

        write_record(args.record, name=args.record.stem, section="host runtime",
                     title=f"`{args.recipe}`: the host path against transformers and llama.cpp",
                     caption=f"A {len(prompt)}-token chat prompt, {args.tokens} greedy tokens; transformers in "
                     "bfloat16 at torch's default thread count and on one thread; llama.cpp through "
                     "llama-cpp-python on the same prompt ids." + "".join(f" {n}." for n in notes),
                     columns=["path", "first-token latency (s)", "decode tokens/s", "peak RSS MiB"],
                     rows=[[r["path"], round(r["first_token_s"], 2), round(r["tokens_per_s"], 3),
                            round(r["peak_rss_mib"])] for r in (ours, *theirs, *llama)]
                     + [[f"llmbuild / {label}", f"{ours['first_token_s'] / r['first_token_s']:.2f}x",
                         f"{ours['tokens_per_s'] / r['tokens_per_s']:.2f}x", None] for label, r in ratios],
                     notes=[load_note])


if __name__ == "__main__":
    main()

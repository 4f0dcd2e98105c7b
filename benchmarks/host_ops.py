"""Where the host path's time goes, op by op, in a prefill and in a decode step:

    python benchmarks/host_ops.py RECIPE [--binary PATH] [--tokens 64] [--repeats 5]

The recipe's binary (build/RECIPE/RECIPE.llmb, or --binary) answers the chat prompt 'What is the capital of
France?' after a warm-up, as `llmbuild run` does; every step of every program the host runs is timed by
wrapping it (a few microseconds a step are the timer's). Prints two tables: the first token (--repeats
prefills, averaged) and the decode (--tokens tokens, per token), each op's milliseconds, calls and
microseconds a call, largest first. This is a profile, not a benchmark record: compare its rows with each
other, and the totals with `benchmarks/host_speed.py` for the speed itself.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llmbuild  # noqa: E402, F401  (pins numpy's BLAS kernels before numpy loads, as `llmbuild run` does)

PROMPT = "What is the capital of France?"


def main() -> None:
    from llmbuild.artifacts.paths import build_root
    from llmbuild.runtime.session import Session

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("--binary", type=Path, help="the .llmb to run (default: the recipe's in the build directory)")
    ap.add_argument("--tokens", type=int, default=64, help="decode tokens timed")
    ap.add_argument("--repeats", type=int, default=5, help="prefills timed")
    args = ap.parse_args()
    path = args.binary or build_root() / args.recipe / f"{args.recipe}.llmb"
    session = Session(path, faithful=False, ignore_eos=True)
    prompt = session.tokenizer.chat_ids([{"role": "user", "content": PROMPT}])
    session.generate(prompt, 4)  # warm-up: weights read, programs bound
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for program in session.model.device._programs.values():
        for i, (step, instr) in enumerate(zip(list(program.steps), program.prog.instrs, strict=True)):
            def timed(step=step, op=instr.op) -> None:
                start = time.perf_counter()
                step()
                spent[op] += time.perf_counter() - start
                calls[op] += 1
            program.steps[i] = timed

    def run(tokens: int) -> tuple[dict[str, float], dict[str, int], float]:
        spent.clear()
        calls.clear()
        session.reset()
        session.generate(prompt, tokens)
        reply = session.last_reply
        return dict(spent), dict(calls), reply.tokens_per_s if tokens > 1 else reply.first_token_s

    prefills = [run(1) for _ in range(args.repeats)]
    mean_s = {op: sum(p[0].get(op, 0.0) for p in prefills) / args.repeats for op in prefills[0][0]}
    table(f"first token ({len(prompt)}-token prompt, mean of {args.repeats}: "
          f"{sum(p[2] for p in prefills) / args.repeats:.3f} s)", mean_s, prefills[0][1], 1)
    # The decode's own: a run of the prompt and --tokens more, less the mean prefill (a profile's precision).
    whole_s, whole_calls, tokens_per_s = run(args.tokens + 1)
    decode_s = {op: whole_s[op] - mean_s.get(op, 0.0) for op in whole_s}
    decode_calls = {op: whole_calls[op] - prefills[0][1].get(op, 0) for op in whole_calls}
    table(f"decode (per token, {args.tokens} tokens: {tokens_per_s:.1f} tokens/s)", decode_s, decode_calls,
          args.tokens)


def table(title: str, spent: dict[str, float], calls: dict[str, int], per: int) -> None:
    """Rows of `spent` seconds and `calls` over `per` tokens (or runs), largest first."""
    print(f"\n{title}\n\n| op | ms | calls | us a call |\n|---|---:|---:|---:|")
    for op, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        n = calls.get(op, 0)
        print(f"| {op} | {seconds / per * 1e3:.2f} | {n / per:.0f} | {seconds / max(1, n) * 1e6:.1f} |")
    print(f"| all steps | {sum(spent.values()) / per * 1e3:.2f} | | |")


if __name__ == "__main__":
    main()

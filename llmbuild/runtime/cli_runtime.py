"""`llmbuild run` and `llmbuild chat`: their arguments and what they do (cli.py wires them)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from llmbuild import LlmbuildError


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="recipe name, build directory or .llmb file")
    p.add_argument("--faithful", action="store_true",
                   help="run on the simulated device (every value through global memory): slow, for verification")
    g = p.add_argument_group("sampling (default: greedy)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: all)")
    g.add_argument("--top-p", type=float, default=1.0, help="keep the most likely tokens up to this probability")
    g.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeating recent tokens")
    g.add_argument("--repetition-window", type=int, default=64, help="how many recent tokens the penalty sees")
    g.add_argument("--seed", type=int, default=None, help="make sampling reproducible")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="end the reply before this text (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the checkpoint's EOS ids")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    _add_common(p)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompt", help="a user message (chat template applied unless --raw)")
    p.add_argument("--prompt-ids", help="comma-separated token ids, fed as they are")
    p.add_argument("--raw", action="store_true", help="tokenize --prompt without the chat template")
    p.add_argument("--image", action="append", default=[], metavar="PATH",
                   help="an image for a vision-language binary, before the prompt (repeat for several)")
    p.add_argument("--json", action="store_true", help='print {"ids", "text", "logits"} (logits of every step)')
    p.add_argument("--bmodel", action="store_true",
                   help="run the recipe's vendor .bmodel on TPU-MLIR's cmodel (greedy) instead of the .llmb")
    p.add_argument("--timing", action="store_true",
                   help="also report the host's first-token latency and decode tokens/s (in the JSON with --json)")


def add_chat_arguments(p: argparse.ArgumentParser) -> None:
    _add_common(p)
    p.add_argument("--max-new-tokens", type=int, default=128, help="per reply")
    p.add_argument("--policy", choices=("stop", "drop_oldest"), default="stop",
                   help="when the conversation fills the KV cache: stop with an error, or drop the oldest turns")
    p.add_argument("--system", help="a system message to start the conversation with")


def _session(args: argparse.Namespace, **extra: Any):
    from llmbuild.runtime.session import Session

    return Session(
        args.target, faithful=args.faithful, max_new_tokens=args.max_new_tokens, stop=args.stop,
        ignore_eos=args.ignore_eos, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        repetition_penalty=args.repetition_penalty, repetition_window=args.repetition_window, seed=args.seed,
        **extra,
    )


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise LlmbuildError(f"--prompt-ids: expected comma-separated integers, got {text!r}") from None


def run_command(args: argparse.Namespace) -> None:
    """One prompt, one reply, printed (or as JSON with the logits of every step)."""
    if args.prompt_ids is None and args.prompt is None:
        raise LlmbuildError("run: give --prompt TEXT or --prompt-ids 1,2,3")
    session = _session(args, keep_logits=args.json)
    images = session.image_pixels(args.image) if args.image else []
    if args.prompt_ids is not None:
        prompt = _parse_ids(args.prompt_ids)
        if images:  # the image tokens first, as a chat message would have them
            prompt = [i for k, p in enumerate(images) for i in session.model.vision.image_ids(p, k)] + prompt
    elif args.raw:
        prompt = session.tokenizer.encode(session.image_prompt(images) + args.prompt)
    else:
        prompt = session.tokenizer.chat_ids([{"role": "user", "content": session.image_prompt(images) + args.prompt}])
    ids = session.generate(prompt, images=images)
    reply = session.last_reply
    assert reply is not None
    if args.json:
        logits = [[float(x) for x in step] for step in reply.logits]
        timing = {"load_s": round(session.load_s, 4), "first_token_s": round(reply.first_token_s, 4),
                  "tokens_per_s": round(reply.tokens_per_s, 3)}
        print(json.dumps({"ids": ids, "text": reply.text, "logits": logits, **(timing if args.timing else {})}))
    else:
        print(reply.text)
        if args.timing:
            print(timing_line(reply, None, "", session.load_s), file=sys.stderr)


def _chip_estimate(meta: dict) -> Any:
    """The cost model's estimate for this binary on its chip, when that module is installed."""
    try:
        from llmbuild.cost import estimate_from_meta  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        return estimate_from_meta(meta)
    except LlmbuildError as exc:
        print(f"(no chip estimate: {exc})", file=sys.stderr)
        return None


def timing_line(reply: Any, estimate: Any, chip: str, load_s: float | None = None) -> str:
    """`load_s`: the model's load (its weights read), before the prompt; the first token is timed after it."""
    loaded = f"loaded in {load_s:.3f} s, " if load_s is not None else ""
    line = f"[host: {loaded}first token {reply.first_token_s:.3f} s, {reply.tokens_per_s:.1f} tokens/s"
    if estimate is not None:
        line += (f" | {chip} estimate: first token {estimate.first_token_latency_s * 1e3:.1f} ms, "
                 f"{estimate.decode_tokens_per_s:.1f} tokens/s")
    if reply.dropped_turns:
        line += f" | dropped the {reply.dropped_turns} oldest turn(s) to fit the KV cache"
    return line + "]"


def chat_command(args: argparse.Namespace, stdin: TextIO | None = None, stdout: TextIO | None = None) -> None:
    """Read messages line by line; stream each reply; /reset starts over, /exit (or end of input) ends."""
    from llmbuild.runtime.compiled_model import CacheFullError

    stdin = stdin or sys.stdin
    out = stdout or sys.stdout
    session = _session(args, policy=args.policy, system=args.system)
    estimate = _chip_estimate(session.model.meta)
    chip = str(session.model.meta.get("chip", "chip"))
    interactive = stdin.isatty()
    pending: list[str] = []  # images given with /image, sent with the next message
    if interactive:
        extra = ", /image PATH adds an image to the next message" if session.model.meta.get("vision") else ""
        print(f"{session.model.meta.get('recipe', args.target)}: /reset starts over, /exit or Ctrl-D ends{extra}",
              file=out)
    while True:
        if interactive:
            print("you> ", end="", flush=True, file=out)
        line = stdin.readline()
        if not line:
            break
        message = line.strip()
        if not message:
            continue
        if message in ("/reset", "/clear"):
            session.reset()
            continue
        if message in ("/exit", "/quit"):
            break
        if message.startswith("/image "):  # an image for the next message (a vision-language binary)
            pending.append(message.removeprefix("/image ").strip())
            continue
        print("assistant> ", end="", flush=True, file=out)
        try:
            session.send(message, stream=lambda piece: print(piece, end="", flush=True, file=out), images=pending)
            pending = []
        except CacheFullError as exc:
            print(file=out)
            print(f"llmbuild: {exc}", file=sys.stderr, flush=True)
            continue
        print(file=out)
        assert session.last_reply is not None
        print(timing_line(session.last_reply, estimate, chip), file=out, flush=True)

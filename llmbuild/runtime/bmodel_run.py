"""`llmbuild run TARGET --bmodel`: a recipe's `.bmodel` generating on the vendor's cmodel (TPU-MLIR's
simulator of the chip the bmodel was built for), for a user without a board. Greedy, as LLM-TPU's demos run
it (`lm_head` returns the top-1 token); the tokenizer and chat template are the `.llmb`'s beside it."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from llmbuild import LlmbuildError
from llmbuild.locations import build_root
from llmbuild.vendor_toolchain import locate


def resolve_bmodel(target: str) -> Path:
    """A .bmodel path, a build directory holding one, or a recipe name (build/<name>/<name>.bmodel)."""
    p = Path(target)
    if p.is_file():
        return p
    found = sorted(p.glob("*.bmodel")) if p.is_dir() else []
    if found:
        return found[0]
    candidate = build_root() / target / f"{target}.bmodel"
    if candidate.is_file():
        return candidate
    raise LlmbuildError(f"{target}: no .bmodel found (looked for {candidate}); build it with "
                        f"`snakemake --cores 2 {target}` (recipe field bmodel.build)")


def run_bmodel(args: argparse.Namespace) -> None:
    from llmbuild.runtime.bmodel_cmodel import CmodelRuntime, bmodel_chip
    from llmbuild.runtime.bmodel_generate import BmodelLM

    if args.temperature or args.top_k or args.top_p != 1.0 or args.repetition_penalty != 1.0 or args.image:
        raise LlmbuildError("run --bmodel: the bmodel's lm_head picks the top-1 token on the chip; sampling and "
                            "images are the .llmb's (drop --bmodel)")
    path = resolve_bmodel(args.target)
    chip = bmodel_chip(path)
    if chip is None:
        raise LlmbuildError(f"{path}: expected a BM1684X or BM1688 bmodel")
    tokenizer, eos = _tokenizer_beside(path)
    if args.prompt_ids is not None:
        from llmbuild.runtime.cli_runtime import _parse_ids

        prompt = _parse_ids(args.prompt_ids)
    elif args.prompt is not None:
        if tokenizer is None:
            raise LlmbuildError(f"{path}: no .llmb beside it to tokenize --prompt with; give --prompt-ids")
        prompt = tokenizer.encode(args.prompt) if args.raw else tokenizer.chat_ids(
            [{"role": "user", "content": args.prompt}])
    else:
        raise LlmbuildError("run: give --prompt TEXT or --prompt-ids 1,2,3")
    with quiet_simulator(), CmodelRuntime(locate().lib, chip) as runtime:
        runtime.load(path)
        lm = BmodelLM(runtime)
        started = time.perf_counter()
        ids = lm.generate(prompt, args.max_new_tokens, eos_ids=() if args.ignore_eos else eos)
        seconds = time.perf_counter() - started
        stats = lm.stats
    text = tokenizer.decode_all(ids) if tokenizer is not None else None
    if args.json:
        out = {"ids": ids, "text": text, "simulator": f"{chip} cmodel"}
        if args.timing:
            out.update({"first_token_s": round(stats.prefill_s, 3), "seconds": round(seconds, 3)})
        print(json.dumps(out))
        return
    print(text if text is not None else ",".join(map(str, ids)))
    if args.timing:
        print(f"{chip} cmodel (simulated, not the chip's speed): first token {stats.prefill_s:.2f} s, "
              f"{len(ids)} tokens in {seconds:.2f} s", file=sys.stderr)


@contextlib.contextmanager
def quiet_simulator() -> Iterator[None]:
    """The cmodel prints a trace of every launch on the process's standard output (fd 1, from C): sent to
    /dev/null meanwhile, so that what llmbuild prints stays readable and parseable."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def _tokenizer_beside(path: Path):
    """The tokenizer and EOS ids of the .llmb built with this bmodel, if it is there."""
    from llmbuild.runtime.compiled_model import CompiledModel, load_tokenizer

    llmb = sorted(path.parent.glob("*.llmb"))
    if not llmb:
        return None, ()
    model = CompiledModel(llmb[0])
    return load_tokenizer(model), tuple(model.meta.get("eos_token_ids") or ())


__all__ = ["quiet_simulator", "resolve_bmodel", "run_bmodel"]

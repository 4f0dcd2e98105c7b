"""`llmbuild run TARGET --bmodel`: a recipe's `.bmodel` generating on the vendor's cmodel (TPU-MLIR's
simulator of the chip the bmodel was built for), for a user without a board. Greedy, as LLM-TPU's demos run
it (`lm_head` returns the top-1 token); the tokenizer and chat template are the `.llmb`'s beside it. An
image (`--image`, a vision-language bmodel) is read and tiled or sliced as the `.llmb`'s runtime does, each
tile or piece run through the bmodel's `vit` net on the cmodel, and its rows put where its tokens are in the
prompt."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from llmbuild import LlmbuildError
from llmbuild.locations import build_root
from llmbuild.runtime.session import image_prompt
from llmbuild.vendor_toolchain import locate

VIT_NET = "vit"  # the vision net's name in LLM-TPU's vision-language bmodels


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

    if args.temperature or args.top_k or args.top_p != 1.0 or args.repetition_penalty != 1.0:
        raise LlmbuildError("run --bmodel: the bmodel's lm_head picks the top-1 token on the chip; sampling is "
                            "the .llmb's (drop --bmodel)")
    path = resolve_bmodel(args.target)
    chip = bmodel_chip(path)
    if chip is None:
        raise LlmbuildError(f"{path}: expected a BM1684X or BM1688 bmodel")
    model = _llmb_beside(path)
    tokenizer, eos = _tokenizer(model)
    vision = _vision(path, model) if args.image else None
    images = [vision.prepare(image) for image in args.image] if vision is not None else []
    feeds = [vit_feeds(vision, prepared, str(image)) for prepared, image in zip(images, args.image or [], strict=True)]
    if args.prompt_ids is not None:
        from llmbuild.runtime.cli_runtime import _parse_ids

        prompt = _parse_ids(args.prompt_ids)
        if vision is not None:  # the image tokens first, as a chat message would have them
            prompt = [i for k, p in enumerate(images) for i in vision.image_ids(p, k)] + prompt
    elif args.prompt is not None:
        if tokenizer is None:
            raise LlmbuildError(f"{path}: no .llmb beside it to tokenize --prompt with; give --prompt-ids")
        text = (image_prompt(tokenizer, vision, images) if vision is not None else "") + args.prompt
        prompt = tokenizer.encode(text) if args.raw else tokenizer.chat_ids([{"role": "user", "content": text}])
    else:
        raise LlmbuildError("run: give --prompt TEXT or --prompt-ids 1,2,3")
    with quiet_simulator(), CmodelRuntime(locate().lib, chip) as runtime:
        runtime.load(path)
        lm = BmodelLM(runtime)
        started = time.perf_counter()
        for feed in feeds:
            lm.add_image(vit_rows(runtime, feed), int(vision.meta["image_token_id"]))
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


def vit_feeds(vision, prepared, where: str) -> list[list[np.ndarray]]:
    """The bmodel's `vit` net's inputs for each of its runs on one prepared image, by its family's runtime
    part (`vendor_feeds`: InternVL's tiles one at a time, MiniCPM-V's pieces as LLM-TPU's runtime feeds them),
    made before the simulator starts: a piece the net cannot take is one line naming the image (`where`)."""
    from llmbuild.families.registry import family_part

    return family_part(vision.family, "runtime").vendor_feeds(vision.meta, prepared, where)


def vit_rows(runtime, feeds: list[list[np.ndarray]]) -> np.ndarray:
    """[runs * tokens, hidden] float32: the bmodel's `vit` net on each run's inputs, rows in run order."""
    rows = [runtime.launch(VIT_NET, inputs)[0] for inputs in feeds]
    return np.concatenate([r.reshape(-1, r.shape[-1]) for r in rows])


def _llmb_beside(path: Path):
    """The .llmb built with this bmodel (its tokenizer, chat template and image preparation), if it is there."""
    from llmbuild.runtime.compiled_model import CompiledModel

    llmb = sorted(path.parent.glob("*.llmb"))
    return CompiledModel(llmb[0]) if llmb else None


def _tokenizer(model):
    """The tokenizer and EOS ids of the .llmb beside the bmodel; (None, ()) without one."""
    from llmbuild.runtime.compiled_model import load_tokenizer

    if model is None:
        return None, ()
    return load_tokenizer(model), tuple(model.meta.get("eos_token_ids") or ())


def _vision(path: Path, model):
    """The .llmb's image preparation for a bmodel with a `vit` net (its family's runtime part: InternVL's
    tiles of the tower's size, MiniCPM-V's slices)."""
    from llmbuild.families.registry import family_part

    if model is None or not isinstance(model.meta.get("vision"), dict):
        raise LlmbuildError(f"{path}: --image needs the vision-language .llmb built beside the bmodel (its image "
                            "preparation and tokens)")
    refused = family_part(model.vision.family, "family").NO_VENDOR_EXPORT
    if refused:  # its build made no vit net for the vendor
        raise LlmbuildError(f"{path}: --image on a bmodel runs its vit net; {refused} has none in a bmodel (run "
                            "the .llmb)")
    return model.vision


__all__ = ["quiet_simulator", "resolve_bmodel", "run_bmodel", "vit_feeds", "vit_rows"]

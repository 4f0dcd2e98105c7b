"""`llmbuild <verb>`: thin argument parsing over the library. Each Snakemake rule calls one verb.

Errors meant for users (LlmbuildError) print one line and exit 2; an unexpected failure prints one line
too (set LLMBUILD_DEBUG=1 for the traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from llmbuild import LlmbuildError

_READ_LOGS: list = []  # the read logs of the recipes this command loaded (written out on request)


def _write_read_logs(where: str) -> None:
    """Append what each step read to `where` (LLMBUILD_READS_LOG), one JSON line a step: how the
    descriptors' declarations were first measured, and how to re-measure them."""
    with open(where, "a", encoding="utf-8") as f:
        for log in _READ_LOGS:
            f.write(json.dumps({"step": log.step, "fields": sorted(log.fields)}) + "\n")


def _recipe(args: argparse.Namespace):
    """The recipe a step's verb runs on, seen through a record of the fields it reads (steps/descriptors.py
    declares them; in strict mode an undeclared read fails the step)."""
    from llmbuild.recipe import load_recipe
    from llmbuild.recipe.reads import watch
    from llmbuild.steps.descriptors import STEPS, step_of

    recipe = load_recipe(args.recipe)
    combine = None
    if args.verb == "bmodel-combine":
        combine = "layer" if args.layer is not None else "head" if args.head else "model"
    step = step_of(args.verb, getattr(args, "net", None), combine)
    if step is None:
        return recipe
    view, log = watch(recipe, step, STEPS[step].allows())
    _READ_LOGS.append(log)
    return view


def cmd_prepare(args: argparse.Namespace) -> None:
    from llmbuild.steps.prepare import prepare

    prepare(_recipe(args))


def cmd_plan(args: argparse.Namespace) -> None:
    from llmbuild.steps.plan import plan

    plan(_recipe(args))


def cmd_compile(args: argparse.Namespace) -> None:
    import shlex
    from pathlib import Path

    from llmbuild.steps.oneshot import CompileRequest, compile_checkpoint

    binary = compile_checkpoint(CompileRequest(
        checkpoint=Path(args.checkpoint), out=Path(args.output), quantize=args.quantize, chip=args.chip,
        seq_length=args.seq_length, prefill_length=args.prefill_length, method=args.method,
        group_size=args.group_size, cores=args.cores,
    ))
    print(f"{binary} (recipe beside it); run it with: llmbuild run {shlex.quote(args.output)} --prompt 'Hello'")
    bmodel = binary.with_suffix(".bmodel")
    if bmodel.is_file():
        print(f"{bmodel}: the vendor's binary for the board (verified on TPU-MLIR's cmodel); try it with: "
              f"llmbuild run {shlex.quote(str(bmodel))} --prompt 'Hello'")


def cmd_quantize(args: argparse.Namespace) -> None:
    from llmbuild.steps.quantize import quantize

    report = quantize(_recipe(args))
    print(f"{report['recipe']}: {report['method']} ({report.get('library', '?')}) wrote the quantized checkpoint "
          f"in {report['step_seconds']} s")


def cmd_reference(args: argparse.Namespace) -> None:
    from llmbuild.artifacts.paths import BuildPaths
    from llmbuild.verify.reference import make_reference

    recipe = _recipe(args)
    paths = BuildPaths.of(recipe)
    make_reference(recipe, paths, paths.reference)


def cmd_layer(args: argparse.Namespace) -> None:
    from llmbuild.steps.layer import build_layer

    recipe = _recipe(args)
    for layer in args.layer:
        build_layer(recipe, layer)


def cmd_check(args: argparse.Namespace) -> None:
    from llmbuild.verify.checks import check_head, check_layer

    recipe = _recipe(args)
    if args.head:
        check_head(recipe)
    for layer in args.layer or ():
        check_layer(recipe, layer)


def cmd_head(args: argparse.Namespace) -> None:
    from llmbuild.steps.head import build_head

    build_head(_recipe(args))


def cmd_vision(args: argparse.Namespace) -> None:
    from llmbuild.steps.vision import build_vision

    build_vision(_recipe(args))


def cmd_bmodel_net(args: argparse.Namespace) -> None:
    from llmbuild.steps.bmodel import build_net

    build_net(_recipe(args), args.net)


def cmd_bmodel_combine(args: argparse.Namespace) -> None:
    from llmbuild.steps.bmodel_combine import combine_head, combine_layer, combine_model

    recipe = _recipe(args)
    if args.layer is not None:
        combine_layer(recipe, args.layer)
    elif args.head:
        combine_head(recipe)
    else:
        combine_model(recipe)


def cmd_bmodel_check(args: argparse.Namespace) -> None:
    from llmbuild.runtime.cmodel_yield import reexec_with_yield

    reexec_with_yield()  # the cmodel's polling engines yield: the same results, sooner
    from llmbuild.artifacts.paths import BuildPaths, read_spec
    from llmbuild.steps.resources import final_check_loads_binary
    from llmbuild.verify.bmodel_checks import check_bmodel

    recipe = _recipe(args)
    spec = read_spec(BuildPaths.of(recipe).spec)
    check_bmodel(recipe, args.part, load_binary=args.part is not None or final_check_loads_binary(recipe, spec))


def cmd_link(args: argparse.Namespace) -> None:
    from llmbuild.steps.link import link

    link(_recipe(args))


def cmd_e2e(args: argparse.Namespace) -> None:
    from llmbuild.verify.e2e import run_e2e

    result = run_e2e(_recipe(args))
    worst = min(step["cosine"] for step in result["step_logits"])
    print(f"greedy ids equal transformers: {result['tokens_equal']} (teacher-forced, "
          f"{result['steps_differing']} of {len(result['ids'])} steps differ); logits cosine "
          f"{result['first_logits']['cosine']} at the first step, {worst} at the worst")


def cmd_verify(args: argparse.Namespace) -> None:
    from llmbuild.verify.verdict import verify

    report = verify(_recipe(args))
    print(f"{report['recipe']}: verification passed ({report['checks']} checks, "
          f"worst cosine top {report['worst_cosine']['top_vs_source']}, "
          f"tpu {report['worst_cosine']['tpu_vs_top']})")


def cmd_run(args: argparse.Namespace) -> None:
    if args.bmodel or args.target.endswith(".bmodel"):
        from llmbuild.runtime.bmodel_run import run_bmodel
        from llmbuild.runtime.cmodel_yield import reexec_with_yield

        reexec_with_yield()
        run_bmodel(args)
        return
    from llmbuild.runtime.cli_runtime import run_command

    run_command(args)


def cmd_chat(args: argparse.Namespace) -> None:
    from llmbuild.runtime.cli_runtime import chat_command

    chat_command(args)


def cmd_estimate(args: argparse.Namespace) -> None:
    from llmbuild.cli_estimate import estimate_command

    estimate_command(args)


def cmd_inspect(args: argparse.Namespace) -> None:
    if args.target.endswith(".bmodel"):
        from llmbuild.runtime.bmodel_inspect import inspect_bmodel

        print(inspect_bmodel(args.target, as_json=args.json))
        return
    from llmbuild.runtime import resolve_binary
    from llmbuild.runtime.inspect_binary import format_report, inspect_binary

    report = inspect_binary(resolve_binary(args.target))
    print(json.dumps(report, indent=1) if args.json else format_report(report))


def cmd_opt(args: argparse.Namespace) -> None:
    """Run a pass pipeline on a module file, as mlir-opt does: e.g. the one a tpu_*.mlir names on its first
    line, on the top_*.mlir beside it (relative file options such as assign-address's plan are read from
    the current directory, where the build ran)."""
    from pathlib import Path

    from llmbuild.artifacts.paths import write_text_atomic
    from llmbuild.dialects import module_text, read_module
    from llmbuild.passes import run_passes
    from llmbuild.passes.pipeline import header_pipeline, parse_pipeline

    if (args.pipeline is None) == (args.pipeline_of is None):
        raise LlmbuildError("opt: give one of --pipeline and --pipeline-of")
    if args.pipeline is not None:
        passes = parse_pipeline(args.pipeline)
    else:  # the build's own line names files relative to the module it heads
        source = Path(args.pipeline_of)
        passes = parse_pipeline(header_pipeline(source.read_text(), args.pipeline_of), relative_to=source.parent)
    text = module_text(run_passes(read_module(Path(args.file)), passes))
    if args.output:
        write_text_atomic(Path(args.output), text)
    else:
        sys.stdout.write(text)


def cmd_recipes(args: argparse.Namespace) -> None:
    from llmbuild.recipe import list_recipes

    for name in list_recipes():
        print(name)


def cmd_layers(args: argparse.Namespace) -> None:
    """Print the layer count of a recipe's model (the Snakefile asks this to expand per-layer jobs)."""
    from llmbuild.steps.dag import layer_count

    print(layer_count(_recipe(args)))


def cmd_zoo_build(args: argparse.Namespace) -> None:
    from pathlib import Path

    from llmbuild.locations import build_root
    from llmbuild.zoo.build import build_zoo, outcome_line
    from llmbuild.zoo.jsonio import write_json
    from llmbuild.zoo.layout import ZooPaths

    paths = ZooPaths(Path(args.zoo))
    results = build_zoo(args.recipes, build_root(), paths.root, args.run, args.snakefile, args.cores)
    for name, result in results.items():
        write_json(paths.result(args.run, name), result)
        print(outcome_line(result))


def cmd_zoo_page(args: argparse.Namespace) -> None:
    from llmbuild.zoo.report import finish_run

    record = finish_run(args.zoo_dir, args.run)
    print(f"{args.zoo_dir}/index.html: {len(record['recipes'])} recipes, {len(record['regressions'])} regressions")


def cmd_zoo_check(args: argparse.Namespace) -> None:
    from llmbuild.locations import build_root
    from llmbuild.zoo.check import latest_regressions

    run, lines = latest_regressions(args.zoo_dir or build_root() / "zoo")
    print("\n".join(lines) if lines else f"zoo run {run}: no regression since the previous run")
    if lines:
        sys.exit(1)  # the nightly's failure: a regression (2 stays "bad input")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmbuild", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True)

    def verb(name: str, fn: Callable, help_text: str, recipe: bool = True) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_text, description=help_text)
        if recipe:
            sp.add_argument("recipe", help="recipe name (recipes/NAME.yaml) or path")
        sp.set_defaults(fn=fn)
        return sp

    sp = verb("compile", cmd_compile, "write a recipe for a checkpoint and build it into OUT (one command)",
              recipe=False)
    sp.add_argument("checkpoint", help="a Hugging Face checkpoint directory or a .gguf file")
    sp.add_argument("--quantize", default="auto",
                    help="f32, bf16, f16, w4bf16, w4f16, w8bf16, w8f16, or auto (the checkpoint's own)")
    sp.add_argument("--method", default="auto", help="auto, rtn, gptq, awq or autoround (w4/w8 from float)")
    sp.add_argument("--group-size", type=int, default=None)
    sp.add_argument("--chip", default="bm1684x")
    sp.add_argument("--seq-length", type=int, required=True)
    sp.add_argument("--prefill-length", type=int, default=None, help="default: min(seq-length, 128)")
    sp.add_argument("--cores", type=int, default=2)
    sp.add_argument("-o", "--output", required=True, help="output directory (its name names the recipe)")
    verb("prepare", cmd_prepare, "make the checkpoint the build reads and write spec.json")
    verb("quantize", cmd_quantize, "quantize the float checkpoint with the recipe's library method (GPTQ, AWQ, ...)")
    verb("reference", cmd_reference, "run transformers on the checkpoint: reference.safetensors")
    verb("plan", cmd_plan, "write the global device-memory plan: plan.json")
    sp = verb("layer", cmd_layer, "compile one layer's prefill, prefill_kv and decode nets")
    sp.add_argument("--layer", type=int, nargs="+", required=True)
    verb("head", cmd_head, "compile the embedding, embedding_cache and lm_head nets")
    sp = verb("check", cmd_check, "check compiled layers (or the head nets) against the reference: metrics.json")
    sp.add_argument("--layer", type=int, nargs="+")
    sp.add_argument("--head", action="store_true")
    verb("vision", cmd_vision, "export, import, compile and check the vit net of a vision-language model")
    verb("link", cmd_link, "link every object into the deployable binary")
    sp = verb("bmodel-net", cmd_bmodel_net, "export one net to TPU-MLIR's top dialect and compile it to a bmodel")
    sp.add_argument("--net", required=True, help="block_I, block_kv_I, block_cache_I, embedding, embedding_cache, "
                    "lm_head or vit")
    sp = verb("bmodel-combine", cmd_bmodel_combine, "combine compiled nets: a layer's, the head's, or the model")
    which = sp.add_mutually_exclusive_group(required=True)
    which.add_argument("--layer", type=int)
    which.add_argument("--head", action="store_true")
    which.add_argument("--model", action="store_true")
    sp = verb("bmodel-check", cmd_bmodel_check, "run the bmodel on the vendor's simulator against the reference")
    sp.add_argument("--part", help="a real-size model's part, checked before the combine: head or layer_I")
    verb("e2e", cmd_e2e, "run the binary against transformers generate: e2e.json")
    verb("verify", cmd_verify, "apply the recipe's tolerances to every check: verify.json")
    sp = verb("zoo-build", cmd_zoo_build, "build the zoo's recipes in one Snakemake run (--keep-going) and "
              "record each one's outcome in ZOO/runs/RUN/RECIPE.json (never fails)", recipe=False)
    sp.add_argument("recipes", nargs="+")
    sp.add_argument("--zoo", required=True, help="the zoo's folder (<build>/zoo)")
    sp.add_argument("--run", required=True)
    sp.add_argument("--snakefile", required=True)
    sp.add_argument("--cores", type=int, default=1)
    sp = verb("zoo-page", cmd_zoo_page, "write the zoo's history record, regressions and pages", recipe=False)
    sp.add_argument("zoo_dir")
    sp.add_argument("--run", required=True)
    sp = verb("zoo-check", cmd_zoo_check, "list the latest zoo run's regressions; exit 1 if any", recipe=False)
    sp.add_argument("zoo_dir", nargs="?", help="default: <build root>/zoo")
    sp = verb("opt", cmd_opt, "run a pass pipeline on a top/tpu module file, as mlir-opt does", recipe=False)
    sp.add_argument("file", help="a .mlir module, e.g. a build's top_<net>.mlir")
    sp.add_argument("--pipeline", help='passes, e.g. \'canonicalize,lower-top-to-tpu{mode="bf16"}\'')
    sp.add_argument("--pipeline-of", metavar="TPU_MLIR", help="the pipeline a tpu_*.mlir names on its first line")
    sp.add_argument("-o", "--output", help="where to write the result (default: standard output)")
    verb("layers", cmd_layers, "print the number of transformer layers of the recipe's model")
    verb("recipes", cmd_recipes, "list the recipes", recipe=False)
    from llmbuild.cli_estimate import add_estimate_arguments  # light: argparse only

    sp = verb("estimate", cmd_estimate, "estimate chip speed and device memory from a recipe or config.json",
              recipe=False)
    add_estimate_arguments(sp)
    sp = verb("inspect", cmd_inspect, "nets, stages, memory map and weight bytes of a binary", recipe=False)
    sp.add_argument("target", help="recipe name, build directory, .llmb or .bmodel file")
    sp.add_argument("--json", action="store_true")
    from llmbuild.runtime.cli_runtime import add_chat_arguments, add_run_arguments  # argparse only

    add_run_arguments(verb("run", cmd_run, "generate from a prompt with a built binary", recipe=False))
    add_chat_arguments(verb("chat", cmd_chat, "chat with a built binary: streams replies, shows speed", recipe=False))
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.fn in (cmd_reference, cmd_e2e):
        # Only where it was measured to pay (allocator.py): keeping every block on the heap made a
        # 7B's lm_head check peak at 6.9 GB instead of 1.4 GB, and a device layer check at 7.4 GB
        # instead of 1.8 GB, slower too (fragments no later request fits).
        from llmbuild.allocator import reuse_freed_memory

        reuse_freed_memory()
    try:
        args.fn(args)
        if (where := os.environ.get("LLMBUILD_READS_LOG")):
            _write_read_logs(where)
    except LlmbuildError as exc:
        print(f"llmbuild: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        if exc.errno == errno.ENOENT and exc.filename:
            # A step run by hand before the step that writes its input, or after Snakemake removed a
            # temporary file (a layer's weight file, once link and the checks have read it).
            print(f"llmbuild: error: {exc.filename}: no such file (an earlier step writes it; `snakemake` runs the "
                  "steps in order and makes it again)", file=sys.stderr)
            return 2
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            return _internal_error(exc)
        # The machine, not the input: say which file could not be written, once.
        print(f"llmbuild: error: {exc.filename or 'a file'}: no space left on the device (free some, then rerun)",
              file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader (e.g. `| head`) went away: not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return 0
    except Exception as exc:  # noqa: BLE001 - the user gets one line, developers the traceback on request
        return _internal_error(exc)
    return 0


def _internal_error(exc: Exception) -> int:
    if os.environ.get("LLMBUILD_DEBUG"):
        raise exc
    print(f"llmbuild: internal error: {type(exc).__name__}: {exc} (LLMBUILD_DEBUG=1 shows the traceback)",
          file=sys.stderr)
    return 1


def entry() -> NoReturn:
    """The `llmbuild` command: main(), then exit without tearing the interpreter down. Every output is
    written (atomically) and closed by then; what is left is freeing what the step held, object by object:
    1.1 s after a SmolLM2 reference (torch, transformers and its resident layers), more than a tenth of the
    step, on every build's critical path. The kernel takes the memory back at once."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        # A reader that went away, a closed stream: nothing left to say.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()

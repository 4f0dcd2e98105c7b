"""GGUF files for llama.cpp from the weights a recipe builds from, for the host-speed benchmarks.

A Hugging Face checkpoint directory becomes a bf16 GGUF through the converter shipped inside llama-cpp-python's
source distribution (`convert_hf_to_gguf.py`, which benchmarks/llama_cpp/setup.sh copies into the venv: the
wheel leaves it out); llama.cpp's own quantizer (`llama_model_quantize`) makes Q4_0 or Q8_0 from that, and
makes the bf16 GGUF of a recipe whose source is a GGUF file (its blocks dequantized, then rounded to bf16, as
the recipe's bf16 build does). The
converter reads float safetensors and GPTQ checkpoints (it dequantizes 2-, 4- and 8-bit GPTQ; not 3-bit), not
AWQ: for a checkpoint it cannot read, `dequantized_checkpoint.py` writes the weights the build reads as a float
directory first. Files are kept beside the recipe's build (build/<recipe>/llama_cpp/) and made again only when
their source is newer. Both tools run in a child process: libllama's OpenMP runtime stays out of the process
that times llmbuild and torch.

    python benchmarks/llama_cpp_gguf.py convert CHECKPOINT_DIR OUT.gguf
    python benchmarks/llama_cpp_gguf.py quantize IN.gguf OUT.gguf q4_0

A checkpoint benchmarks/make_checkpoint.py generated carries a stand-in tokenizer whose BPE pre-tokenizer the
converter does not recognize: it is converted with that pre-tokenizer written as llama.cpp's "default" (the
benchmarks give llama.cpp token ids, never text).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

VERSION = "0.3.36"  # the llama-cpp-python release benchmarks/llama_cpp/setup.sh builds
SETUP = "bash benchmarks/llama_cpp/setup.sh"
CONVERTER_DIR = Path(sys.prefix) / "share" / "llama-cpp-python"
# llama_ftype values (llama.h) of the files llama.cpp's quantizer makes here.
FTYPES = {"q4_0": 2, "q8_0": 7, "bf16": 32}
CONVERTER_GPTQ_BITS = (2, 4, 8)  # what the converter's GPTQ dequantizer implements
STANDIN_STAMP = "random_checkpoint.json"  # make_checkpoint.py's stamp: random weights, a stand-in tokenizer


def missing() -> str | None:
    """Why llama.cpp's rows cannot run (one line), or None when llama-cpp-python and its converter are here."""
    # By its distribution, not `import llama_cpp`: benchmarks/ is on sys.path, and its llama_cpp/ folder (the
    # setup script) would import as an empty namespace package when the real one is absent.
    try:
        installed = metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        return f"llama.cpp rows skipped: llama-cpp-python is not installed ({SETUP} builds it, many minutes)"
    if installed != VERSION:
        return f"llama.cpp rows skipped: llama-cpp-python {installed} is installed, these benchmarks pin {VERSION} " \
               f"({SETUP})"
    if not (CONVERTER_DIR / "convert_hf_to_gguf.py").is_file():
        return f"llama.cpp rows skipped: no GGUF converter in {CONVERTER_DIR} ({SETUP} copies it there)"
    return None


def fresh(out: Path, *sources: Path) -> bool:
    """`out` exists and is newer than every file of `sources` (files or directories)."""
    if not out.is_file():
        return False
    files = [f for s in sources for f in ([s] if s.is_file() else s.iterdir()) if f.is_file()]
    return all(f.stat().st_mtime <= out.stat().st_mtime for f in files)


def converter_reads(checkpoint: Path) -> str | None:
    """None when the converter reads this checkpoint directory's weights, else why not (one line)."""
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    quant = config.get("quantization_config") or config.get("text_config", {}).get("quantization_config")
    if not quant:
        return None
    method = quant.get("quant_method")
    if method == "gptq" and quant.get("bits") in CONVERTER_GPTQ_BITS:
        return None
    return (f"the GGUF converter of llama.cpp {VERSION} cannot read {method} checkpoints"
            + (f" with {quant.get('bits')}-bit weights" if method == "gptq" else ""))


def convert(checkpoint: Path, out: Path, outtype: str = "bf16") -> Path:
    """`checkpoint` (an HF directory) as a GGUF file of `outtype` at `out` (kept when fresh)."""
    if fresh(out, checkpoint):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    args = [str(checkpoint), "--outfile", str(partial), "--outtype", outtype]
    # A generated checkpoint's stand-in tokenizer (benchmarks/make_checkpoint.py) has a pre-tokenizer whose
    # hash the converter does not know; the benchmarks feed llama.cpp token ids, so its tokenizer plays no part.
    standin = (checkpoint / STANDIN_STAMP).is_file()
    cmd = ([sys.executable, __file__, "convert-standin", *args] if standin
           else [sys.executable, str(CONVERTER_DIR / "convert_hf_to_gguf.py"), *args])
    _run(cmd, f"converting {checkpoint.name} to {outtype} GGUF")
    partial.replace(out)
    return out


def quantize(src: Path, out: Path, kind: str) -> Path:
    """`src` (a GGUF) made by llama.cpp's quantizer into `kind` (q4_0, q8_0 or bf16) at `out` (kept when fresh);
    a quantized `src` is dequantized to float32 first."""
    if kind not in FTYPES:
        raise ValueError(f"quantize: expected one of {', '.join(FTYPES)}, got {kind!r}")
    if fresh(out, src):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    _run([sys.executable, __file__, "quantize", str(src), str(partial), kind], f"quantizing {src.name} to {kind}")
    partial.replace(out)
    return out


def recipe_ggufs(recipe_name: str, kinds: tuple[str, ...] = ("q4_0",)) -> tuple[dict[str, Path], str | None]:
    """GGUF files of the weights the recipe builds from: "bf16" and each of `kinds`, under build/<recipe>/llama_cpp/;
    and a note when they are made from the dequantized weights (a checkpoint the converter cannot read)."""
    from llmbuild.artifacts.layer_weights import quantized_checkpoint_dir
    from llmbuild.artifacts.paths import BuildPaths
    from llmbuild.recipe import load_recipe

    recipe = load_recipe(recipe_name)
    paths = BuildPaths.of(recipe)
    root = paths.root / "llama_cpp"
    bf16 = root / "bf16.gguf"
    files = {"bf16": bf16}
    qdir = quantized_checkpoint_dir(recipe, paths)
    if qdir is None and recipe.source.kind == "gguf":  # the build's checkpoint/ holds only the file's tokenizer
        from llmbuild.frontend.sources import gguf_file

        quantize(gguf_file(recipe.source), bf16, "bf16")
        files.update((kind, quantize(bf16, root / f"{kind}.gguf", kind)) for kind in kinds)
        return files, None
    # The directory llmbuild reads: the quantized checkpoint (imported, or the build's quantize step's), an hf
    # source's own directory, else the float checkpoint the build's prepare step wrote (synthetic sources).
    hf = recipe.source.kind == "hf" and recipe.source.path
    source = qdir or (Path(recipe.source.path) if hf else paths.checkpoint)
    why = converter_reads(source)
    note = None if why is None else f"{why}: llama.cpp's GGUF holds the dequantized weights the build reads"
    if not fresh(bf16, source):
        if why is None:
            convert(source, bf16)
        else:
            from dequantized_checkpoint import write_dequantized

            tmp = write_dequantized(recipe_name, root / "dequantized")
            try:
                convert(tmp, bf16)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    files.update((kind, quantize(bf16, root / f"{kind}.gguf", kind)) for kind in kinds)
    return files, note


def _run(cmd: list[str], what: str) -> None:
    print(f"# {what}", file=sys.stderr)
    result = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if result.returncode != 0:
        lines = [line for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        # The tools' own last error line (llama.cpp logs its reason before our exit message), else the last.
        errors = [line for line in lines if "error" in line.lower() or "failed" in line.lower()]
        reason = (errors or lines or [f"exit status {result.returncode}"])[-1]
        raise RuntimeError(f"{what} failed: {reason.strip()}")


def _quantize_here(src: Path, out: Path, kind: str) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.nthread = os.cpu_count() or 1
    params.allow_requantize = True  # a quantized source (the bf16 GGUF of a GGUF recipe) is read dequantized
    status = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params)
    if status != 0:
        sys.exit(f"{src}: llama_model_quantize returned {status}")


def _convert_standin(args: list[str]) -> None:
    """The converter on a generated checkpoint: a BPE pre-tokenizer it does not recognize is written as
    llama.cpp's "default" instead of refused (only the tokenizer's pre-split rules depend on it)."""
    import runpy

    sys.path[:0] = [str(CONVERTER_DIR), str(CONVERTER_DIR / "gguf-py")]
    from conversion import base  # the converter's own package, beside it

    recognized = base.TextModel.get_vocab_base_pre

    def lenient(self, tokenizer):  # noqa: ANN001, ANN202 - the converter's signature
        try:
            return recognized(self, tokenizer)
        except NotImplementedError:
            return "default"

    base.TextModel.get_vocab_base_pre = lenient
    sys.argv = [str(CONVERTER_DIR / "convert_hf_to_gguf.py"), *args]
    runpy.run_path(sys.argv[0], run_name="__main__")


def main() -> None:
    if sys.argv[1:2] == ["convert-standin"]:
        _convert_standin(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("convert")
    c.add_argument("checkpoint", type=Path)
    c.add_argument("out", type=Path)
    c.add_argument("--outtype", default="bf16")
    q = sub.add_parser("quantize")
    q.add_argument("src", type=Path)
    q.add_argument("out", type=Path)
    q.add_argument("kind", choices=sorted(FTYPES))
    args = ap.parse_args()
    if args.verb == "convert":
        convert(args.checkpoint, args.out, args.outtype)
    else:
        _quantize_here(args.src, args.out, args.kind)


if __name__ == "__main__":
    main()

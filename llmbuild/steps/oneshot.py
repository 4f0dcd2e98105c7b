"""`llmbuild compile CHECKPOINT --quantize MODE --chip CHIP --seq-length S -o OUT`: the incumbent's
one-command converter, as a recipe and the ordinary DAG.

It writes OUT/<name>.yaml for the checkpoint (architecture and quantization detected), then runs the
same Snakemake DAG as `snakemake <recipe>` with the recipe directory and the build directory pointed at
OUT, so the binary, every intermediate file and the recipe end up side by side in OUT: `llmbuild run
OUT` runs the binary, and editing the recipe and compiling again rebuilds only what changed. The build
shows its progress on stderr as it goes (steps/progress.py) and ends with the binary or the failed step's
one-line message.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from llmbuild import LlmbuildError
from llmbuild.recipe_types import LIBRARY_METHODS, MODE_CHOICES
from llmbuild.steps.progress import declared_minutes, run_with_progress

SNAKEFILE = Path(__file__).resolve().parent.parent.parent / "Snakefile"
# A recipe's name is its Snakemake target and its build directory's name: letters, digits, underscores
# and hyphens. The output folder's name is used as it is when it is one, else a name derived from it.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
# Where the DAG's build directory points when the folder's name is not the recipe's: a link back to OUT.
LINK_FOLDER = ".llmbuild"


def recipe_name(folder: str) -> str:
    """`qwen2-7b` stays; `my model.v2` becomes `my_model_v2`."""
    if NAME.match(folder):
        return folder
    return re.sub(r"[^A-Za-z0-9_-]+", "_", folder).strip("_-") or "model"


@dataclass(frozen=True)
class CompileRequest:
    checkpoint: Path
    out: Path
    quantize: str
    chip: str
    seq_length: int
    prefill_length: int | None = None
    method: str = "auto"
    group_size: int | None = None
    cores: int = 2


def recipe_for(req: CompileRequest) -> tuple[str, str]:
    """(recipe name, recipe YAML) for the request; the checkpoint is inspected, never loaded."""
    name = recipe_name(req.out.name)
    if req.quantize not in MODE_CHOICES:
        raise LlmbuildError(f"--quantize: expected one of {', '.join(MODE_CHOICES)}, got {req.quantize}")
    checkpoint = req.checkpoint.expanduser().resolve()
    source, architecture, vision = _source(checkpoint)
    prefill = req.prefill_length or min(req.seq_length, 128)
    quant: dict = {"mode": req.quantize}
    if req.method != "auto":
        quant["method"] = req.method
    if req.group_size is not None:
        quant["group_size"] = req.group_size
    recipe = {
        "description": f"{checkpoint.name}, {req.quantize} on {req.chip} (written by llmbuild compile)",
        "architecture": architecture,
        "source": source,
        "quantization": quant,
        "target": {"chip": req.chip},
        "stages": {"seq_length": req.seq_length, "prefill_length": prefill},
        **({"vision": vision} if vision else {}),
        "verify": {"exact_tokens": req.quantize == "f32"},
    }
    header = (f"# Written by `llmbuild compile {checkpoint} --quantize {req.quantize} --chip {req.chip} "
              f"--seq-length {req.seq_length} -o {req.out}`.\n# Edit it and run the same command (or "
              f"`snakemake {name} --config recipes_dir={shlex.quote(str(req.out))} "
              f"build_dir={shlex.quote(str(build_dir_for(req.out, name)))}`) to rebuild.\n"
              f"# The end-to-end check's prompt: {_prompt_kind(checkpoint)}.\n")
    # JSON is YAML: one value per line, no YAML writer needed, and nothing a template engine would expand.
    body = "\n".join(f"{key}: {json.dumps(value)}" for key, value in recipe.items())
    return name, header + body + "\n"


def _source(checkpoint: Path) -> tuple[dict, str, dict | None]:
    """(the recipe's source, its architecture, its vision section or None)."""
    from llmbuild.families.registry import family_for_gguf, family_for_hf_model_type, vision_family_for_hf_model_type
    from llmbuild.frontend.hf import text_config

    if checkpoint.is_file() and checkpoint.suffix == ".gguf":
        from llmbuild.frontend.gguf_source import gguf_metadata

        arch = gguf_metadata(checkpoint).get("general.architecture")
        return {"kind": "gguf", "path": str(checkpoint)}, family_for_gguf(str(arch)), None
    config = checkpoint / "config.json"
    if not config.is_file():
        raise LlmbuildError(f"{checkpoint}: expected a Hugging Face checkpoint directory (with config.json) "
                            "or a .gguf file")
    try:
        fields = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LlmbuildError(f"{config}: cannot read JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise LlmbuildError(f"{config}: expected a JSON object")
    # A vision-language config.json's model_type names the recipe's vision.family (the registry's).
    family = vision_family_for_hf_model_type(fields.get("model_type"))
    text = text_config(fields)
    vision = {"family": family} if family and text is not fields else None
    architecture = family_for_hf_model_type(str(text.get("model_type")), str(config))
    return {"kind": "hf", "path": str(checkpoint)}, architecture, vision


def _prompt_kind(checkpoint: Path) -> str:
    """Which prompt the reference will use (verify/reference.py: prompt_ids_for), said in the recipe."""
    from llmbuild.verify.reference import DEFAULT_PROMPT, has_tokenizer

    hello = f"{DEFAULT_PROMPT!r}"
    if checkpoint.is_file():
        return f"{hello} through the GGUF file's chat template, or as plain text when it has none"
    if not has_tokenizer(checkpoint):
        return "fixed token ids (the checkpoint has no tokenizer; set verify.prompt_ids to change them)"
    config = checkpoint / "tokenizer_config.json"
    template = (checkpoint / "chat_template.jinja").is_file() or (checkpoint / "chat_template.json").is_file()
    if config.is_file():
        try:
            fields = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            fields = None  # the reference step names the unreadable file
        template = template or (isinstance(fields, dict) and bool(fields.get("chat_template")))
    if template:
        return f"{hello} through the checkpoint's chat template (set verify.prompt or verify.prompt_ids to change it)"
    return f"{hello} as plain text (the checkpoint has no chat template; set verify.prompt to change it)"


def build_dir_for(out: Path, name: str) -> Path:
    """The build directory D with D/<name> = OUT: OUT's parent, or OUT/.llmbuild (holding a link <name> ->
    OUT, made by `_link_build_dir`) when the folder's name is not the recipe's; every artifact lands in OUT."""
    return out.parent if out.name == name else out / LINK_FOLDER


def _link_build_dir(out: Path, name: str) -> Path:
    folder = build_dir_for(out, name)
    if out.name != name:
        folder.mkdir(exist_ok=True)
        link = folder / name
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            link.symlink_to("..", target_is_directory=True)
    return folder


def compile_checkpoint(req: CompileRequest) -> Path:
    """Write the recipe, check it loads (every recipe error before any work), run the DAG; the binary."""
    from llmbuild.recipe import load_recipe

    if req.method != "auto" and req.method not in ("rtn", *LIBRARY_METHODS):
        raise LlmbuildError(f"--method: expected auto, rtn, {', '.join(LIBRARY_METHODS)}, got {req.method}")
    name, text = recipe_for(req)
    out = req.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    recipe_path = out / f"{name}.yaml"
    tmp = recipe_path.with_name(recipe_path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(recipe_path)
    recipe = load_recipe(name, out)
    if not SNAKEFILE.is_file():
        raise LlmbuildError(f"{SNAKEFILE}: not found; `llmbuild compile` runs the Snakefile of a source checkout "
                            "(pip install -e .)")
    build_dir = _link_build_dir(out, name)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    # Not --quiet: the progress is read from Snakemake's job lines, which stay off the terminal.
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(SNAKEFILE), "--directory", str(out),
           "--cores", str(req.cores), "--config", f"recipes_dir={out}", f"build_dir={build_dir}", "--", name]
    started = time.time()
    result = run_with_progress(cmd, env, name, declared_minutes(recipe))
    if result.returncode != 0:
        from llmbuild.steps.failures import step_errors

        reasons = step_errors(build_dir, started)
        if reasons:  # the step's own message, already `llmbuild: error: ...`
            log, message = reasons[0]
            raise LlmbuildError(f"{message.split(': ', 2)[-1]} (the build of {recipe_path}; log: {log})")
        raise LlmbuildError(f"the build of {recipe_path} failed: {_snakemake_reason(result.tail)} "
                            f"(Snakemake's log: {result.state.snakemake_log or out / '.snakemake' / 'log'})")
    return out / f"{name}.llmb"


def _snakemake_reason(tail: list[str]) -> str:
    """Snakemake's own first error line (a missing input, a rule that failed without an llmbuild message)."""
    for line in tail:
        if "Error" in line or "Exception" in line:
            return line.strip()
    return "Snakemake stopped"

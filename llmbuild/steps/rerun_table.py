"""Which steps rerun when one recipe field changes: every field of the schema flipped on representative
recipes, the steps whose rerun digest changes listed, and those that then rerun because an input changed.

docs/reruns.md is this table; a test keeps it identical to what the code computes and checks, through
Snakemake's dry run, that a build reruns what the table says. Regenerate it with
``python -c 'from llmbuild.steps.rerun_table import update_doc; update_doc("docs/reruns.md")'``.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llmbuild import LlmbuildError
from llmbuild.recipe.schema_table import FIELDS, FieldSpec
from llmbuild.steps.descriptors import STEPS, Step, canonical, read_values, steps_of

# A text model, one rounded in the build, one quantized by a library in the build, an imported GGUF, and a
# vision-language model: between them every field applies somewhere.
REPRESENTATIVE = ("qwen2_tiny_f32", "qwen2_tiny_w4_rtn", "qwen2_tiny_w4", "smollm2_135m_bf16", "internvl_tiny_f32")
_CALIBRATION_TEXT = "A second calibration text, for the table of reruns. " * 40


@dataclass(frozen=True)
class Flip:
    field: str
    value: Any  # what the field was set to; None where no value the loader accepts differs
    direct: tuple[str, ...]  # the steps whose digest changed
    downstream: tuple[str, ...]  # the steps that rerun because one of those rewrote their input
    note: str = ""


def step_digests(recipe) -> dict[str, str]:
    """The recipe digest of every step its build has (without the calibration text's part, which
    steps/dag.py adds)."""
    return {name: hashlib.sha256(canonical(read_values(recipe, STEPS[name])).encode()).hexdigest()[:16]
            for name in steps_of(recipe)}


def downstream_of(direct: set[str], present: set[str]) -> set[str]:
    """The steps among `present` that rerun because `direct` do: those reading an output of a rerun step
    (descriptors' `after`), and those whose temporary outputs a rerun step reads (`temp_from`: deleted once
    read, they are made again), to a fixed point."""
    rerun = set(direct)
    changed = True
    while changed:
        changed = False
        for name in present - rerun:
            step = STEPS[name]
            if any(a in rerun for a in step.after) or any(name in STEPS[r].temp_from for r in rerun):
                rerun.add(name)
                changed = True
    return rerun - direct


def candidates(spec: FieldSpec, current: Any, recipes: Path) -> Iterator[Any]:
    """Values that differ from `current`, most ordinary first; the loader decides which is valid."""
    if spec.path == "quantization.calibration":
        path = recipes / "calibration_flip.txt"
        path.write_text(_CALIBRATION_TEXT)
        yield path.name
        return
    if spec.path == "source.path" and current is not None:
        yield f"{str(current).rstrip('/')}/."  # the same checkpoint, written differently
        return
    if spec.constraint is not None and hasattr(spec.constraint, "choices"):
        yield from (c for c in spec.constraint.choices() if c != current)
        return
    if spec.type == "boolean":
        yield (not current) if current is not None else False
    elif spec.type == "integer":
        yield from ([8 << 30] if current is None else [current * 2, current // 2, current + 1])
    elif spec.type == "number":
        yield 0.5
    elif spec.type == "string":
        yield "Say hello in one word."
    elif spec.type == "list[int]":
        yield [3, 4, 5]
    elif spec.type == "mapping" and spec.path in ("source.config", "vision.config"):
        yield _changed_config(spec.path, current)
    elif spec.type == "mapping":
        yield from ({"damp_percent": 0.02}, {"iters": 3}, {"max_calib_seq_len": 256})


def _changed_config(path: str, current: dict | None) -> dict:
    if path == "source.config":
        return {"rms_norm_eps": (current or {}).get("rms_norm_eps", 1e-6) * 10}
    return {"vision_config": {"num_hidden_layers": 3}}


def flips(name: str, recipes_dir: Path) -> list[Flip]:
    """Each schema field of recipe `name` (in `recipes_dir`) flipped in turn."""
    from llmbuild.recipe import load_recipe

    base = load_recipe(name, recipes_dir=recipes_dir)
    before = step_digests(base)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for f in recipes_dir.glob("*.yaml"):
            shutil.copy(f, work / f.name)
        for spec in FIELDS:
            if spec.type == "section":
                continue
            if spec.path == "base":
                out.append(Flip(spec.path, None, (), (), "inheritance: the merged recipe is what the steps read"))
                continue
            out.append(_flip(name, spec, base, before, work))
    return out


def _flip(name: str, spec: FieldSpec, base, before: dict[str, str], work: Path) -> Flip:
    from llmbuild.recipe import load_recipe

    section, _, key = spec.path.rpartition(".")
    current = base.raw.get(section, {}).get(key) if section else base.raw.get(key)
    if spec.kinds is not None and base.source.kind not in spec.kinds:
        return Flip(spec.path, None, (), (), f"not a field of a {base.source.kind} source")
    for value in candidates(spec, current, work):
        if value == current:
            continue
        (work / "flipped.yaml").write_text(yaml.safe_dump(flipped_tree(name, spec.path, value), sort_keys=False))
        try:
            after = step_digests(load_recipe("flipped", recipes_dir=work))
        except LlmbuildError:
            continue
        direct = {s for s in after if after[s] != before.get(s)}  # a step the edit adds runs too
        return Flip(spec.path, value, _ordered(direct), _ordered(downstream_of(direct, set(after))))
    return Flip(spec.path, None, (), (), "no other value is valid in this recipe")


def flipped_tree(name: str, field: str, value: Any) -> dict[str, Any]:
    """A recipe that is `name` with `field` set to `value` (a mapping merges into the inherited one)."""
    section, _, key = field.rpartition(".")
    return {"base": name, **({key: value} if not section else {section: {key: value}})}


def flip_in_place(recipes_dir: Path, name: str, field: str, value: Any) -> None:
    """Set `field` of recipe `name` in `recipes_dir` to `value`, under the same name (what a user's edit
    does): the original moves to a hidden base the edited recipe inherits."""
    hidden = f"_unflipped_{name}"
    (recipes_dir / f"{name}.yaml").rename(recipes_dir / f"{hidden}.yaml")
    (recipes_dir / f"{name}.yaml").write_text(yaml.safe_dump(flipped_tree(hidden, field, value), sort_keys=False))
    if field == "quantization.calibration":
        (recipes_dir / str(value)).write_text(_CALIBRATION_TEXT)


def _ordered(steps: set[str]) -> tuple[str, ...]:
    return tuple(s for s in STEPS if s in steps)


def table_markdown(recipes_dir: Path) -> str:
    lines = ["# What reruns when a recipe field changes", "",
             "Generated by `llmbuild/steps/rerun_table.py` from the step descriptors "
             "(`llmbuild/steps/descriptors.py`): each field of the recipe schema set to another valid value on "
             "representative recipes. *Reads it*: the steps whose rerun digest covers the field (their "
             "descriptors declare it, and under the tests a step that reads an undeclared field fails). *Then*: "
             "the steps that rerun because an output they read was rewritten, or because a rerun step reads a "
             "temporary output of theirs (a layer's weight file, deleted once link and the checks read it, is "
             "made again: a changed check recompiles the layers it checks). A test checks both columns "
             "against Snakemake's own dry run and keeps this page identical to the code. Steps named `bmodel_*` "
             "exist where the recipe builds the vendor's bmodel.", ""]
    for name in REPRESENTATIVE:
        lines += [f"## `{name}`", "", "| field | set to | reads it | then |", "|---|---|---|---|"]
        for flip in flips(name, recipes_dir):
            shown = f"`{_short(flip.value)}`" if flip.value is not None else flip.note
            lines.append(f"| `{flip.field}` | {shown} | {', '.join(flip.direct) or 'nothing'} | "
                         f"{', '.join(flip.downstream) or '-'} |")
        lines.append("")
    lines += ["## The steps", "", "| step | verb | reads |", "|---|---|---|"]
    for step in STEPS.values():
        lines.append(f"| {step.name} | `llmbuild {step.verb}` | {_reads_words(step)} |")
    return "\n".join(lines) + "\n"


def _reads_words(step: Step) -> str:
    words = [f"`{r}`" for r in step.reads]
    words += [f"{d.name} (of {', '.join(f'`{f}`' for f in d.fields)}: {d.why})" for d in step.derived]
    return ", ".join(words)


def _short(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()
    return text if len(text) <= 60 else text[:57] + "..."


def update_doc(path: str | Path, recipes_dir: str | Path = "recipes") -> bool:
    """Rewrite `path` with the current table; True when it changed."""
    path, text = Path(path), table_markdown(Path(recipes_dir))
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    path.write_text(text, encoding="utf-8")
    return True

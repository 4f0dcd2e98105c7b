"""What the Snakefile asks of a recipe while it builds the DAG: layer counts, rerun digests, priorities.

Each rule takes, as params, a digest of exactly the recipe fields its step reads (its descriptor in
steps/descriptors.py), plus a digest of llmbuild's own code: Snakemake reruns a step when one of them
changes, and only then.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cache
from pathlib import Path

from llmbuild.artifacts.paths import VIT_NET
from llmbuild.recipe import load_recipe
from llmbuild.recipe_types import Recipe
from llmbuild.steps.descriptors import PRIORITY_CHECKS, PRIORITY_DEVICE_CHECKS, STEPS, canonical, net_step, read_values
from llmbuild.vendor_toolchain import VERSION as VENDOR_VERSION

PACKAGE_DIR = Path(__file__).resolve().parent.parent


def recipe_problems(names: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(missing, broken): recipe name -> the loader's one-line message, for recipes whose checkpoint is not
    on this machine and for recipes that do not load. Neither stops the workflow: each keeps a target
    that fails with its message, and `all` builds the others."""
    from llmbuild import LlmbuildError, MissingCheckpointError

    missing, broken = {}, {}
    for name in names:
        try:
            recipe(name)
            recipe_spec(name)  # the DAG's shape comes from it (a GGUF file's header is read only here)
        except MissingCheckpointError as exc:
            missing[name] = str(exc)
        except LlmbuildError as exc:
            broken[name] = str(exc)
    return missing, broken


@cache
def recipe(name: str) -> Recipe:
    return load_recipe(name)


def when_vision(name: str, *patterns: str) -> list[str]:
    """`patterns` (the vision rule's outputs, `{recipe}` in them) for a recipe with a vision tower, else
    none: link reads the vit net only where there is one."""
    if recipe(name).vision is None:
        return []
    return [p.replace("{recipe}", name) for p in patterns]


def code_digest(step: str | None = None, recipe_name: str | None = None) -> str:
    """sha256 over the llmbuild sources a step runs (its descriptor's entry modules and their import closure)
    and the data it reads; for an unknown step, over the whole package.

    The closure rather than the package: an edit of cli.py or of the runtime's chat loop reruns nothing that
    reads weights; an edit of a pass reruns the compile steps, not prepare, the reference or the quantize
    step's minutes of calibration. (Snakemake's ancient() would stop such cascades, but in 9.27 it also masks
    the steps after it.) The recipe loader is in every step's closure: the typed values a step reads
    (defaults included) come from it.

    A step that looks families up in the registry runs modules no `import` statement names (the registry
    imports a family's modules by name): its closure takes, of `recipe_name`'s families (its architecture's
    and its vision family's; every registered family's when no recipe is named), the modules of the roles
    its code asks for (`family_part(..., "verify")` and the like; `family` always), so an edit inside a
    family's folder reruns the steps of that family's recipes that use it, and no other."""
    if step not in STEPS:
        return _digest_of(("",))
    entry = (*STEPS[step].entry, "llmbuild.recipe")
    closure = import_closure(entry)
    if REGISTRY_FILE in closure:
        closure = _with_family_roles(entry, family_packages(recipe_name))
    files = sorted({*closure, *STEPS[step].data})
    return _digest_of(tuple(files))


REGISTRY_FILE = "families/registry.py"
_ROLE = re.compile(r"""family_part(?:_if_any)?\([^()]*?,\s*["'](\w+)["']\)""")


@cache
def _with_family_roles(entry: tuple[str, ...], packages: tuple[str, ...]) -> frozenset[str]:
    """The import closure of `entry` plus, for each family package, the role modules the closure asks the
    registry for, to a fixed point (a role module may ask for another role)."""
    roles = {"family"}
    while True:
        closure = import_closure((*entry, *(f"{p}.{role}" for p in packages for role in sorted(roles))))
        asked = {role for path in closure for role in _ROLE.findall((PACKAGE_DIR / path).read_text())}
        if asked <= roles:
            return closure
        roles |= asked


@cache
def family_packages(recipe_name: str | None) -> tuple[str, ...]:
    """The packages (folders) of the families a recipe's steps reach through the registry; every
    registered family's for None."""
    from llmbuild.families.registry import FAMILIES

    if recipe_name is None:
        names = sorted(FAMILIES)
    else:
        r = recipe(recipe_name)
        names = [r.architecture, *([r.vision.family] if r.vision is not None else [])]
    return tuple(FAMILIES[n].folder for n in names if n in FAMILIES)


@cache
def _digest_of(parts: tuple[str, ...]) -> str:
    """Keyed by the parts, not the step: shared parts are read once per Snakefile parse."""
    h = hashlib.sha256()
    for part in parts:
        root = PACKAGE_DIR / part
        for path in sorted(root.rglob("*")) if root.is_dir() else [root]:
            if path.is_file() and path.suffix in (".py", ".yaml", ".txt", ".json") and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(PACKAGE_DIR)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()[:16]


@cache
def import_closure(modules: tuple[str, ...]) -> frozenset[str]:
    """The llmbuild source files (relative to the package) that importing `modules` can run: every
    `import` statement of each file, at any depth, followed within the package; a package brings its
    __init__.py and, named as an entry, all its modules."""
    seen: set[str] = set()
    todo = list(modules)
    for entry in modules:
        package = PACKAGE_DIR / _relative(entry)
        if package.is_dir():
            todo += [_module_name(p) for p in package.rglob("*.py") if "__pycache__" not in p.parts]
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if path is None or path in seen:
            continue
        seen.add(path)
        todo += _parents(name)
        todo += _imports(PACKAGE_DIR / path, name)
    return frozenset(seen)


def _relative(module: str) -> Path:
    return Path(*module.split(".")[1:])


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE_DIR).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["llmbuild", *parts])


@cache  # asked some 5,000 times a Snakefile parse (every import of every step's closure): two stats each
def _module_file(module: str) -> str | None:
    if module != "llmbuild" and not module.startswith("llmbuild."):
        return None
    rel = _relative(module)
    if rel == Path("."):
        return "__init__.py"
    for candidate in (rel.with_suffix(".py"), rel / "__init__.py"):
        if (PACKAGE_DIR / candidate).is_file():
            return str(candidate)
    return None


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


_IMPORT = re.compile(r"^\s*import\s+([\w., ]+)", re.M)
_FROM = re.compile(r"^\s*from\s+(\.*[\w.]*)\s+import\s+(\([^)]*\)|[^\n]*)", re.M)


@cache
def _imports(path: Path, module: str) -> tuple[str, ...]:
    """The llmbuild modules a file imports, anywhere in it (a regular-expression scan: the Snakefile reads
    these on every parse, and an AST walk of the package took seconds)."""
    text = path.read_text(encoding="utf-8")
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[str] = []
    for match in _IMPORT.finditer(text):
        found += [name.strip().split(" ")[0] for name in match.group(1).split(",")]
    for match in _FROM.finditer(text):
        base = match.group(1)
        level = len(base) - len(base.lstrip("."))
        base = base.lstrip(".")
        if level:
            anchor = package.split(".")[: len(package.split(".")) - (level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        names = re.findall(r"\w+", match.group(2).split("#")[0] if "(" not in match.group(2) else match.group(2))
        found.append(base)
        found += [f"{base}.{name}" for name in names if name != "as"]  # `from pkg import module`
    return tuple(name for name in found if name == "llmbuild" or name.startswith("llmbuild."))


def digest(name: str, step: str) -> str:
    """The rerun digest of `step` for recipe `name`: the values of the fields its descriptor declares
    (llmbuild/steps/descriptors.py), and for the quantize step the calibration text's content."""
    r = recipe(name)
    values = read_values(r, STEPS[step])
    if step == "quantize" and r.quantization.calibration:
        text = Path(r.quantization.calibration).read_bytes()  # the data, wherever the file lives
        values["=calibration_text"] = hashlib.sha256(text).hexdigest()
    return hashlib.sha256(canonical(values).encode()).hexdigest()[:16]


def priority(step: str) -> int:
    return STEPS[step].priority


def command(step: str, arguments: str) -> str:
    """A rule's shell command: the step's verb on `arguments`, its output into the rule's log."""
    return f"llmbuild {STEPS[step].verb} {arguments} > {{log:q}} 2>&1"


def builds_bmodel(name: str) -> bool:
    """Whether the recipe's build makes the vendor's .bmodel (recipe field `target.bmodel`, unless this run's
    configuration says `bmodel: false`)."""
    from llmbuild.locations import bmodel_allowed
    from llmbuild.recipe_types import builds_bmodel as recipe_builds_bmodel

    return bmodel_allowed() and recipe_builds_bmodel(recipe(name))


def when_bmodel(name: str, *files: str) -> list[str]:
    """`files` (with `{recipe}` in them) for a recipe that builds the bmodel, else none."""
    return [f.replace("{recipe}", name) for f in files] if builds_bmodel(name) else []


BMODEL_HEAD_NETS = ("embedding", "embedding_cache", "lm_head")
# A layer's bmodel nets (prefill, history, decode): the stage's prefix and the layer.
BMODEL_BLOCK_NET = re.compile(r"^(block|block_kv|block_cache)_(\d+)$")


def head_net_names(vision: bool) -> list[str]:
    """The nets combined as the head's part: the embeddings and lm_head, and a vision-language recipe's vit."""
    return [*BMODEL_HEAD_NETS, *([VIT_NET] if vision else [])]


def bmodel_check_parts(name: str) -> list[str]:
    """The parts of a real-size recipe's bmodel checked in jobs of their own (verify/bmodel_check_policy.py)."""
    from llmbuild.verify.bmodel_check_policy import check_parts

    return check_parts(recipe_spec(name))


def bmodel_head_nets(name: str) -> list[str]:
    return head_net_names(recipe(name).vision is not None)


TOOLCHAIN_VERSION = VENDOR_VERSION


def layer_net_names(history: bool, layer: int | str) -> list[str]:
    """A layer's nets in a bmodel: prefill and decode, and prefill on a history in the history form (the
    incumbent's names, importer/nets.py's STAGE_NET)."""
    return [f"block_{layer}", *([f"block_kv_{layer}"] if history else []), f"block_cache_{layer}"]


def bmodel_layer_nets(name: str, layer: int | str) -> list[str]:
    return layer_net_names(recipe(name).bmodel.history, layer)


def bmodel_net_digest(name: str, net: str) -> str:
    """The rerun digest of one bmodel net: its kind's descriptor (a block, an embedding, lm_head, the vit)."""
    return digest(name, net_step(net))


@cache
def bmodel_resources(name: str, job: str, net: str = ""):
    """mem_mb and runtime of a bmodel job (`net`, `combine` or `check`) from the model's shapes."""
    from llmbuild.steps.resources import bmodel_resources as resources_of

    return resources_of(recipe(name), recipe_spec(name), job, net)


def uses_quantize_step(name: str) -> bool:
    from llmbuild.recipe_types import LIBRARY_METHODS

    return recipe(name).quantization.origin in LIBRARY_METHODS


def rounded_scales(name: str, files: list[str]) -> list[str]:
    """`files` (a shard's rounded_scales.safetensors) when the build rounds the recipe's projections itself
    (the layer job writes them for the checks), else none."""
    from llmbuild.artifacts.layer_weights import rounds_in_build

    return files if rounds_in_build(recipe(name)) else []


def bmodel_layer_files(name: str, net: str, build: str) -> list[str]:
    """What a block net's job reads from its layer's job when the build rounds the recipe's projections
    itself: the layer's device weights and float32 scales (and the plan that places them), the levels that
    job rounded, read back to the bit (artifacts/layer_weights.checked_layer_weights) instead of rounded
    again in every net's job; none otherwise."""
    from llmbuild.artifacts.layer_weights import rounds_in_build

    match = BMODEL_BLOCK_NET.match(net)
    if match is None or not rounds_in_build(recipe(name)):
        return []
    layer = f"{build}/{name}/layers/{match.group(2)}"
    return [f"{build}/{name}/plan.json", f"{layer}/weights.safetensors", f"{layer}/rounded_scales.safetensors"]


def calibration_file(name: str) -> list[str]:
    r = recipe(name)
    return [r.quantization.calibration] if uses_quantize_step(name) and r.quantization.calibration else []


@cache
def resources(name: str, step: str, layers: tuple[int, ...] = ()):
    """mem_mb and runtime_min of `step` for recipe `name` (llmbuild/steps/resources.py); `layers`: a check
    job's layers (one the simulated device checks needs less memory than one the host path checks)."""
    from llmbuild.steps.resources import step_resources
    from llmbuild.verify.layer_check_policy import faithful_layers

    spec = recipe_spec(name)
    faithful = bool(layers) and all(i in faithful_layers(spec.num_layers) for i in layers)
    return step_resources(recipe(name), spec, step, faithful)


@cache
def recipe_spec(name: str):
    """The model spec from the recipe's configuration (no weights read), once per Snakefile parse."""
    from llmbuild.frontend.config_spec import spec_without_weights

    return spec_without_weights(recipe(name).source)


def reference_threads(name: str) -> int:
    """The reference's threads (rules/reference.smk): it streams every layer once per generated token,
    while compiling reads each once, so past a few billion parameters it outlasts the compile jobs and
    should have both cores; below, one, and the compile jobs run beside it."""
    from llmbuild.cost.chip_estimate import param_count

    return 2 if param_count(recipe_spec(name)) > 3e9 else 1


def check_priority(name: str, layers: list[int]) -> int:
    """A check shard's priority: higher when it runs a layer on the simulated device."""
    from llmbuild.verify.layer_check_policy import faithful_layers

    return PRIORITY_DEVICE_CHECKS if faithful_layers(layer_count(name)) & set(layers) else PRIORITY_CHECKS


@cache
def layer_shards(name: str) -> list[list[int]]:
    """The layers of `name`'s model in the jobs that build them (llmbuild/steps/shards.py)."""
    from llmbuild.steps.shards import shard_layers

    return shard_layers(recipe_spec(name))


@cache
def layer_count(r: Recipe | str) -> int:
    if isinstance(r, str):
        r = recipe(r)
    src = r.source
    if src.kind == "synthetic":
        assert src.config is not None
        return int(src.config["num_hidden_layers"])
    if src.kind == "hf":
        assert src.path is not None
        from llmbuild.frontend.hf import text_config  # a vision-language config's language part, its family's

        cfg = text_config(json.loads((Path(src.path) / "config.json").read_text()))
        return int(cfg["num_hidden_layers"])
    from llmbuild.frontend.gguf_source import gguf_metadata
    from llmbuild.frontend.sources import gguf_file

    meta = gguf_metadata(gguf_file(src))
    arch = meta["general.architecture"]
    return int(meta[f"{arch}.block_count"])

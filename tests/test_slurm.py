"""The cluster profile on a real SLURM: scripts/slurm-local.sh brings up a single-node cluster on this machine,
a tiny recipe builds through `snakemake --profile profiles/slurm`, SLURM's own records show that every
rule of the build ran as a SLURM job, and the binary equals a local build of the same recipe byte for byte;
the zoo sends jobs of several recipes to the cluster at once, a broken recipe failing alone.

Root only (the script starts daemons, writes /etc/slurm and installs Debian's packages when missing);
skipped otherwise, or when the packages cannot be installed, unless LLMBUILD_REQUIRE_SLURM=1 (.ci/run sets it
when CI runs as root), where a skip would hide a broken cluster setup. Each chained job costs a few seconds
of SLURM scheduling, status polling and Snakemake start-up in the job: one tiny recipe, 2 to 3 minutes on
2 cores; the zoo of one buildable recipe and two broken ones, about 2 minutes.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from helpers import ROOT, job_stats, nan_weights_recipe, snakemake

RECIPE = "qwen2_tiny_f32"
SCRIPT = ROOT / "scripts" / "slurm-local.sh"
REQUIRED = os.environ.get("LLMBUILD_REQUIRE_SLURM") == "1"


def _skip(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"LLMBUILD_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


def _script(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cluster():
    """The local cluster, started for this module and stopped after it, unless it already ran (someone's
    trial, or .ci/run): then it is left running."""
    if os.geteuid() != 0:
        _skip("needs root: scripts/slurm-local.sh starts munged, slurmctld and slurmd and writes /etc/slurm")
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        _skip("snakemake-executor-plugin-slurm is not installed (scripts/install.sh installs it)")
    was_running = _script("status").returncode == 0
    started = _script("start")
    if started.returncode != 0:
        message = started.stderr.strip().splitlines()[-1] if started.stderr.strip() else "no message"
        if "apt-get" in message:  # the packages cannot be installed here (no archive, no apt-get)
            _skip(f"the SLURM packages cannot be installed: {message}")
        pytest.fail(f"scripts/slurm-local.sh start failed: {started.stdout}{started.stderr}")
    yield
    if not was_running:
        stopped = _script("stop")
        assert stopped.returncode == 0, stopped.stderr
        assert _script("status").returncode != 0, "the cluster still runs after stop"
        # Its config gone too: one naming a stopped controller costs every later `snakemake` start 9 s.
        assert not Path("/etc/slurm/slurm.conf").exists(), "stop left /etc/slurm/slurm.conf behind"


def _job_stats(out: str) -> Counter:
    """The jobs Snakemake planned, by rule (its job-stats table)."""
    assert "Job stats:" in out.splitlines(), out[-3000:]
    return Counter(job_stats(out))


def _slurm_jobs(prefix: str) -> list[dict[str, str]]:
    """This run's jobs as slurmctld lists them (it keeps finished jobs for MinJobAge, 600 s): id, rule
    (from the comment the plugin sets, `rule_<rule>[_wildcards_<values>]`), state, partition."""
    out = subprocess.run(["squeue", "--states=all", "--noheader", "--format=%i|%j|%k|%T|%P"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    jobs = []
    for line in out.splitlines():
        job_id, name, comment, state, partition = line.strip().split("|")
        if name.startswith(prefix):
            rule = re.sub(r"_wildcards_.*$", "", comment.removeprefix("rule_"))
            jobs.append({"id": job_id, "rule": rule, "state": state, "partition": partition, "comment": comment})
    return jobs


def _finished_jobs() -> dict[str, str]:
    """Every finished job in the job-completion record (`sacct -c`, jobcomp/filetxt): id -> state."""
    out = subprocess.run(["sacct", "-c", "--noheader", "--parsable2", "--format=JobID,JobName,State,Partition"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return {line.split("|")[0]: line.split("|")[2] for line in out.splitlines() if line.strip()}


@pytest.mark.longer("test_a_zoo_on_slurm_builds_its_recipes_side_by_side")
def test_a_tiny_recipe_builds_on_slurm_as_it_builds_locally(cluster, tmp_path: Path) -> None:
    slurm_build, local_build = tmp_path / "slurm-build", tmp_path / "local-build"
    # Job names are <prefix>_<run uuid>: the prefix finds this run's jobs among any others of the cluster.
    prefix = f"llmbuild-test-{uuid.uuid4().hex[:12]}"
    cmd = [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", "--workflow-profile", "none", "--nolock",
           RECIPE, "--config", f"build_dir={slurm_build}", "bmodel=false", "--slurm-jobname-prefix", prefix,
           "--slurm-logdir", str(tmp_path / "slurm-logs")]
    # No vendor bmodel (`bmodel=false`, as the local build below): its per-net jobs would each pay SLURM's
    # chained scheduling cost; tests/test_bmodel_build.py covers that binary.
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMBUILD_")}
    # The local build first, not beside the SLURM run (two runs of 2 cores each on a 2-core machine). Every
    # Snakemake run of the tests goes without the lock (tests/snakemake-profile): the two pytest workers
    # start runs in the repository at once, and one's clean-up of .snakemake/locks breaks the other's lock.
    snakemake(local_build, RECIPE)
    started = time.monotonic()
    try:
        result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
    finally:
        for job in _slurm_jobs(prefix):  # a failed run, or one killed at the timeout, leaves no job behind
            if job["state"] in ("PENDING", "RUNNING"):
                subprocess.run(["scancel", job["id"]], capture_output=True, timeout=30)
    elapsed = time.monotonic() - started
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]

    # Every job Snakemake planned ran as a SLURM job (the per-recipe target, which has no command, is a
    # local rule), each exactly once, each completed, in the partition the profile gives its rule.
    planned = _job_stats(out)
    assert planned.pop(RECIPE) == 1, planned
    jobs = _slurm_jobs(prefix)
    listing = "\n".join(f"{j['id']:>6} {j['rule']:<28} {j['state']:<10} {j['partition']}" for j in jobs)
    print(f"\nsnakemake --profile profiles/slurm {RECIPE}: {elapsed:.0f} s; squeue --states=all:\n{listing}")
    assert Counter(j["rule"] for j in jobs) == planned, listing
    assert {"prepare", "plan", "reference", "head", "link", "head_check", "e2e", "verify"} <= set(planned)
    assert {f"layers_{RECIPE}_0_1", f"checks_{RECIPE}_0_1"} <= set(planned)
    assert all(j["state"] == "COMPLETED" and j["partition"] == "main" for j in jobs), listing
    # The job-completion record (what `sacct -c` reads) has them too: jobs that really ended on the node.
    finished = _finished_jobs()
    assert all(finished.get(j["id"]) == "COMPLETED" for j in jobs), finished

    # The same binary as on one machine, and a verified build.
    binary = f"{RECIPE}/{RECIPE}.llmb"
    assert (slurm_build / binary).read_bytes() == (local_build / binary).read_bytes()
    assert (slurm_build / RECIPE / "verify.json").is_file()


def test_the_profile_sends_quantize_to_the_large_partition(tmp_path: Path) -> None:
    """The calibration step asks for the larger partition, every other step for the default one (a dry run:
    no cluster needed; on the local cluster it ran in `large` as tried by hand, README "On a cluster")."""
    build = tmp_path / "build"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMBUILD_")}
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", "--workflow-profile", "none", "-n",
         f"{build}/qwen2_tiny_w4/quantize.json", "--config", f"build_dir={build}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    # Each job: "rule NAME:" and its indented lines (output, resources, ...).
    blocks = {m.group(1): m.group(2) for m in re.finditer(r"^rule (\w+):\n((?: {4}.*\n?)*)", out, re.M)}
    assert set(blocks) == {"prepare", "quantize"}, out[-3000:]
    assert "slurm_partition=large" in blocks["quantize"] and "slurm_partition" not in blocks["prepare"], blocks


def test_the_script_says_what_it_cannot_do() -> None:
    """A usage error, and a caller who is not root, get one line and a non-zero exit before anything is touched."""
    usage = _script("restart", timeout=30)
    assert usage.returncode != 0
    assert usage.stderr.strip() == "slurm-local.sh: usage: slurm-local.sh start|stop|status"
    if os.geteuid() != 0:
        refused = _script("start", timeout=30)
        assert refused.returncode != 0
        assert refused.stderr.strip().startswith("slurm-local.sh: must run as root"), refused.stderr


def _finished_spans() -> dict[str, dict[str, str]]:
    """Every finished job in the job-completion record: id -> state, start and end (ISO local times)."""
    out = subprocess.run(["sacct", "-c", "--noheader", "--parsable2", "--format=JobID,State,Start,End"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    spans = {}
    for line in out.splitlines():
        if line.strip():
            job_id, state, start, end = line.split("|")[:4]
            spans[job_id] = {"state": state, "start": start, "end": end}
    return spans


def test_a_zoo_on_slurm_builds_its_recipes_side_by_side(cluster, tmp_path: Path) -> None:
    """The zoo's one Snakemake run (--keep-going) submits jobs of every recipe together: SLURM's record
    shows jobs of two recipes running at the same time, the recipe with a NaN weight failed at `prepare`
    (its job FAILED, its row saying why) while the tiny recipe verified, its binary byte-identical to a local
    build. A recipe that does not load never reaches the cluster and is shown failed too."""
    recipes_dir = tmp_path / "recipes"
    recipes_dir.mkdir()
    # One recipe that builds: its prepare job and the NaN recipe's are submitted together, so two recipes'
    # jobs run at once (a second buildable recipe cost 13 more jobs, each a Snakemake start-up).
    built = ("qwen2_tiny_f32",)
    for name in ("_tiny_common.yaml", *(f"{r}.yaml" for r in built)):
        shutil.copy(ROOT / "recipes" / name, recipes_dir / name)
    broken = nan_weights_recipe(recipes_dir, tmp_path / "nan_checkpoint")
    (recipes_dir / "typo_tiny.yaml").write_text("base: qwen2_tiny_f32\nstages:\n  seq_length: big\n")
    names = (*built, broken, "typo_tiny")
    local_build = tmp_path / "local-build"
    snakemake(local_build, *built)  # first, not beside the cluster's jobs

    slurm_build = tmp_path / "slurm-build"
    prefix = f"llmbuild-zoo-{uuid.uuid4().hex[:12]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMBUILD_")}
    env.update(LLMBUILD_RECIPES=str(recipes_dir), LLMBUILD_BUILD_DIR=str(slurm_build), LLMBUILD_BMODEL="0",
               HF_HUB_OFFLINE="1", LLMBUILD_ZOO_SNAKEMAKE_ARGS=(
                   f"--profile profiles/slurm --workflow-profile none --nolock --cores 256 "
                   f"--slurm-jobname-prefix {prefix} --slurm-logdir {tmp_path / 'slurm-logs'}"))
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", "zoo", "--config", f"recipes=[{','.join(names)}]"]
    started = time.monotonic()
    try:
        result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    finally:
        for job in _slurm_jobs(prefix):
            if job["state"] in ("PENDING", "RUNNING"):
                subprocess.run(["scancel", job["id"]], capture_output=True, timeout=30)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]

    from test_zoo import page_rows

    rows = page_rows(slurm_build / "zoo" / "index.html")
    assert {name: rows[name][0] for name in names} == {**dict.fromkeys(built, "verified"), broken: "failed",
                                                      "typo_tiny": "failed"}, rows
    assert "prepare: llmbuild: error: " in rows[broken][1] and "NaN or Inf" in rows[broken][1], rows[broken]
    assert "typo_tiny.yaml:3: stages.seq_length: expected an integer" in rows["typo_tiny"][1], rows["typo_tiny"]

    # SLURM's record: every build job of the run, which recipe it was (its rule and wildcards), and when it
    # ran. Jobs of two different recipes overlap in time; the NaN recipe's prepare job failed.
    jobs = _slurm_jobs(prefix)
    spans = _finished_spans()
    for job in jobs:
        job["recipe"] = next((n for n in names if n in job["comment"]), None)
        job.update(spans.get(job["id"], {}))
    listing = "\n".join(f"{j['id']:>6} {j['rule']:<28} {j['recipe'] or '':<16} {j.get('state', ''):<10} "
                        f"{j.get('start', '')} {j.get('end', '')}" for j in jobs)
    print(f"\nzoo on SLURM ({', '.join(names)}): {elapsed:.0f} s; sacct -c:\n{listing}")
    assert {j["recipe"] for j in jobs} == {*built, broken}, listing
    assert [j["state"] for j in jobs if j["recipe"] == broken] == ["FAILED"], listing
    assert all(j["state"] == "COMPLETED" for j in jobs if j["recipe"] != broken), listing
    overlapping = [(a["id"], b["id"]) for a in jobs for b in jobs
                   if a["recipe"] < b["recipe"] and a["start"] < b["end"] and b["start"] < a["end"]]
    assert overlapping, f"no two recipes' jobs ran at the same time:\n{listing}"

    for name in built:
        binary = f"{name}/{name}.llmb"
        assert (slurm_build / binary).read_bytes() == (local_build / binary).read_bytes(), name

"""The sha256 of every deployable binary the shipped recipes build, as a table: the check that a refactor
changed no byte of what a user deploys.

    python benchmarks/binary_digests.py [--build-dir DIR] [--recipes NAME ...] [--json FILE]
                                        [--compare FILE [--compare-build DIR] | --earlier REV [--remove-builds]]
                                        [--record FILE]

It builds the binaries only (each recipe's `.llmb` and, where the recipe makes one, its `.bmodel`; no
verification), with Snakemake as a user would. Recipes whose checkpoint is not on this machine are listed
as such, not built. `--compare` reads a table written earlier by `--json` (e.g. at the commit before a
refactor) and exits 1 naming every binary whose digest differs; with `--compare-build` (the build folder that
table was made from), a `.bmodel` that differs only in the 3 bytes the vendor's code generator leaves unset
in `lm_head` (they differ between two runs of the vendor's own converter: docs/bmodel.md) counts as equal.
`--record` writes the table, with the comparison, as a benchmark record (benchmarks/records.py).

`--earlier REV` makes the comparison in one run: each recipe is built first by the llmbuild of git revision REV
(a detached worktree of this repository, its package ahead of this one on the Python path, the same
environment otherwise), then by this one, and the two compared. With `--remove-builds` each recipe's two
build folders are deleted once compared, so a table of real-size recipes needs the disk of one recipe's
builds, not of all of them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/records.py


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def buildable(names: list[str]) -> tuple[list[str], dict[str, str]]:
    """The recipes whose checkpoint is here, and the others with the loader's one-line reason."""
    from llmbuild.steps.dag import recipe_problems

    missing, broken = recipe_problems(names)
    if broken:
        raise SystemExit("recipes that do not load: " + "; ".join(f"{k}: {v}" for k, v in broken.items()))
    return [n for n in names if n not in missing], missing


def build(name: str, targets: list[Path], source: Path, env: dict[str, str], cores: int, which: str) -> None:
    """Snakemake on the binaries alone, run in `source` (this repository or the earlier revision's tree)."""
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(cores), *map(str, targets)],
                         cwd=source, env=env, capture_output=True, text=True)
    if run.returncode:
        sys.stderr.write(run.stderr[-3000:])
        raise SystemExit(f"{name}: the build{which} failed (snakemake exit {run.returncode})")
    print(f"{name}: built{which} in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)


def package_first(tree: Path) -> dict[str, str]:
    """This process's environment with `tree`'s llmbuild first on the Python path of Snakemake and every job
    (an editable install may point at another checkout)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}


class EarlierTree:
    """A revision of this repository checked out beside it (a detached git worktree), whose llmbuild builds
    into a folder of its own: its package is put first on the Python path of its Snakemake and of every job."""

    def __init__(self, revision: str, build_dir: Path) -> None:
        self.build_dir = build_dir
        self.tree = build_dir.parent / "earlier-source"
        git = ["git", "-C", str(ROOT)]
        commit = subprocess.run([*git, "rev-parse", "--short", f"{revision}^{{commit}}"], capture_output=True,
                                text=True)
        if commit.returncode:
            raise SystemExit(f"--earlier {revision}: not a commit of this repository")
        self.commit = commit.stdout.strip()
        self.close()  # a worktree an interrupted run left there
        shutil.rmtree(self.tree, ignore_errors=True)
        subprocess.run([*git, "worktree", "add", "--detach", str(self.tree), self.commit], check=True,
                       capture_output=True)

    def build(self, name: str, binaries: list[str], cores: int) -> dict[str, str]:
        """The earlier revision's binaries of recipe `name`, by their sha256."""
        # The recipes find their checkpoints beside this repository, not beside the worktree.
        env = {**package_first(self.tree), "LLMBUILD_BUILD_DIR": str(self.build_dir),
               "LLMBUILD_MODELS": os.environ.get("LLMBUILD_MODELS", str(ROOT / "models"))}
        targets = [self.build_dir / name / b for b in binaries]
        build(name, targets, self.tree, env, cores, f" at {self.commit}")
        return {t.name: sha256(t) for t in targets}

    def keep_only_bmodels(self, name: str) -> None:
        """The earlier build of `name` less everything but its .bmodel (a 7B's build holds three times it)."""
        for path in (self.build_dir / name).iterdir():
            if path.suffix != ".bmodel":
                shutil.rmtree(path) if path.is_dir() else path.unlink()

    def close(self) -> None:
        """The worktree removed (nothing happens where there is none)."""
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(self.tree)], capture_output=True)


def binary_targets(build_dir: Path, name: str) -> list[Path]:
    from llmbuild.steps.dag import builds_bmodel

    targets = [build_dir / name / f"{name}.llmb"]
    if builds_bmodel(name):
        targets.append(build_dir / name / f"{name}.bmodel")
    return targets


def same_but_unset(path: Path, compare_build: Path | None, name: str, binary: str) -> bool:
    """Whether a `.bmodel` differs from the earlier build's only in lm_head's unset bytes."""
    from llmbuild.bmodel.bmodel_file import differing_offsets, only_unset_bytes

    earlier = compare_build / name / binary if compare_build else None
    if earlier is None or not binary.endswith(".bmodel") or not earlier.exists():
        return False
    differing = differing_offsets(path, earlier)
    if differing is None or not only_unset_bytes(differing):
        return False
    print(f"{name}/{binary}: equal but for the vendor's unset bytes at {differing}", file=sys.stderr)
    return True


def compare(args: argparse.Namespace, before: dict, name: str, binary: str, digest: str) -> str:
    """The binary against the earlier table: same, same but the vendor's unset bytes, differs, or not there."""
    earlier = before.get("binaries", {}).get(name, {}).get(binary)
    if earlier is None:
        return "not compared"
    if earlier == digest:
        return "same"
    if same_but_unset(args.build_dir.resolve() / name / binary, args.compare_build, name, binary):
        return "same but lm_head's unset bytes"
    return "differs"


def write_digest_record(args: argparse.Namespace, before: dict, rows: dict[str, dict[str, str]],
                        sizes: dict[tuple[str, str], int], status: dict[tuple[str, str], str],
                        missing: dict[str, str]) -> None:
    from records import command_line, write_record

    # The earlier table and build folder live outside the repository: named by their role in the command.
    placeholders = {str(args.compare): "EARLIER.json", str(args.compare_build): "EARLIER_BUILD",
                    str(args.build_dir): "BUILD", str(args.json): "TABLE.json"}
    command = command_line([placeholders.get(word, word) for word in sys.argv])
    earlier = before.get("commit", "an earlier table")
    table = [[name, binary, round(sizes[name, binary] / 2**20, 1), rows[name][binary][:16], same]
             for (name, binary), same in status.items()]
    if args.earlier:
        notes = [f"`earlier`: the same recipe's binary as built, in the same run, by llmbuild at {earlier} "
                 "(`--earlier`: a worktree of that commit, the same environment)."]
    elif before:
        notes = [f"`earlier`: the same recipe's binary as built at llmbuild {earlier} (EARLIER.json: this command's "
                 "`--json` table, run at that commit into EARLIER_BUILD)."]
    else:
        notes = []
    if missing:
        notes.append(f"Not built here (no checkpoint on this machine): {', '.join(sorted(missing))}.")
    from llmbuild.recipe import list_recipes

    if left_out := sorted(set(list_recipes(buildable_only=True)) - set(rows) - set(missing)):
        notes.append(f"Shipped recipes not in this run: {', '.join(left_out)}.")
    write_record(args.record, name=args.record.stem, section="reproducible binaries",
                 title="The shipped recipes' binaries, and the same at an earlier commit",
                 caption="Each recipe's `.llmb` and `.bmodel` built with Snakemake from a clean folder; the first 16 "
                         "hex digits of each sha256.",
                 columns=["recipe", "binary", "MiB", "sha256", "earlier"], rows=table, notes=notes, command=command)


def main() -> int:
    from llmbuild.recipe import list_recipes

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build" / "digests")
    ap.add_argument("--recipes", nargs="*", help="default: every buildable shipped recipe")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write the table here")
    ap.add_argument("--compare", type=Path, help="a table written by --json to compare with")
    ap.add_argument("--compare-build", type=Path, help="the build folder the --compare table was made from")
    ap.add_argument("--earlier", metavar="REV", help="build each recipe at this git revision too, and compare")
    ap.add_argument("--remove-builds", action="store_true", help="delete each recipe's builds once compared")
    ap.add_argument("--record", type=Path, help="write the table as a benchmark record (benchmarks/records/)")
    args = ap.parse_args()
    if args.earlier and (args.compare or args.compare_build):
        ap.error("--earlier builds the earlier binaries itself: not with --compare or --compare-build")

    os.environ["LLMBUILD_BUILD_DIR"] = str(args.build_dir.resolve())
    names, missing = buildable(args.recipes or list_recipes(buildable_only=True))
    rows: dict[str, dict[str, str]] = {}
    before: dict = json.loads(args.compare.read_text()) if args.compare else {}
    status: dict[tuple[str, str], str] = {}
    sizes: dict[tuple[str, str], int] = {}
    earlier = EarlierTree(args.earlier, args.build_dir.resolve() / "earlier") if args.earlier else None
    if earlier:
        before["commit"], args.compare_build = earlier.commit, earlier.build_dir
    try:
        for name in names:
            targets = binary_targets(args.build_dir.resolve(), name)
            if earlier:
                before.setdefault("binaries", {})[name] = earlier.build(name, [t.name for t in targets], args.cores)
                if args.remove_builds:
                    earlier.keep_only_bmodels(name)  # hashed: only a .bmodel's unset bytes are looked at again
            build(name, targets, ROOT, package_first(ROOT), args.cores, "")
            rows[name] = {t.name: sha256(t) for t in targets}
            sizes.update({(name, t.name): t.stat().st_size for t in targets})
            status.update({(name, binary): compare(args, before, name, binary, digest)
                           for binary, digest in rows[name].items()})
            if args.remove_builds:
                shutil.rmtree(args.build_dir.resolve() / name, ignore_errors=True)
                if earlier:
                    shutil.rmtree(earlier.build_dir / name, ignore_errors=True)
    finally:
        if earlier:
            earlier.close()
    print("| recipe | binary | sha256 | earlier |\n|---|---|---|---|")
    for (name, binary), same in status.items():
        print(f"| {name} | {binary} | `{rows[name][binary]}` | {same} |")
    for name in missing:
        print(f"| {name} | (checkpoint not here) | | |")
    if args.json:
        from records import git_commit

        args.json.write_text(json.dumps({"commit": git_commit(), "binaries": rows, "not_here": sorted(missing)},
                                        indent=2) + "\n")
    if args.record:
        write_digest_record(args, before, rows, sizes, status, missing)
    differ = [f"{name}/{binary}" for (name, binary), same in status.items() if same == "differs"]
    earlier_name = f"the build at {before.get('commit')}" if args.earlier else args.compare.name if args.compare else ""
    if differ:
        print(f"differ from {earlier_name}: {', '.join(differ)}", file=sys.stderr)
        return 1
    if earlier_name:
        print(f"every binary also in {earlier_name} is byte-identical", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

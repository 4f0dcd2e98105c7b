"""LLM-TPU's own runtime on a bmodel llmbuild built: its Qwen3 `python_demo/chat.cpp` (the C++ that the
vendor's demos run on a board), compiled here for x86 against TPU-MLIR's runtime and cmodel libraries, drives
the bmodel greedily on the simulator; `llmbuild run --bmodel` (llmbuild's ctypes driver of the same
libraries) runs the same prompt, and the ids of both are printed side by side. A second turn goes through
`forward_first` again, as LLM-TPU's `pipeline.py` does: the new turn's tokens alone where the bmodel has the
history nets (`bmodel.history: true`), the whole conversation otherwise.

    python benchmarks/incumbent/llmtpu_chat.py --llm-tpu LLM-TPU-CHECKOUT --bmodel build/R/R.bmodel \\
        --prompt-ids 1,5,9,42 --steps 16 [--turn 7,8,9] [--json OUT]

LLM-TPU is not a dependency of llmbuild: give a checkout of https://github.com/sophgo/LLM-TPU (its
`support/include` headers and `models/Qwen3/python_demo/chat.cpp` are read). Needs `g++` and pybind11
(`pip install pybind11`). Exit status 0 when both runtimes give the same ids in every turn.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from llmbuild.runtime.bmodel_cmodel import bmodel_chip, link_chip_libraries  # noqa: E402
from llmbuild.vendor_toolchain import locate  # noqa: E402

CHAT_SOURCE = Path("models/Qwen3/python_demo/chat.cpp")

# Run in a process of its own (a process holds one simulator): LLM-TPU's module, greedy, turn by turn.
DRIVER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import chat
model = chat.Qwen()
model.init([0], sys.argv[2])
model.generation_mode = "greedy"
steps, turns, out = int(sys.argv[3]), json.loads(sys.argv[4]), []
conversation = []
for k, turn in enumerate(turns):
    if k and not model.support_history:
        model.clear_kv()
        tokens = conversation + turn
    else:
        tokens = list(turn)
    ids = [model.forward_first(tokens)]
    while len(ids) < steps:
        ids.append(model.forward_next())
    conversation += turn + ids
    out.append(ids)
print("IDS " + json.dumps({"ids": out, "history": bool(model.support_history)}), flush=True)
model.deinit()
"""


def build_module(llm_tpu: Path, libs: Path, work: Path) -> Path:
    """LLM-TPU's chat.cpp as a Python extension (its CMakeLists' flags, without -Werror: GCC 12 warns)."""
    import pybind11

    source = llm_tpu / CHAT_SOURCE
    if not source.is_file():
        raise SystemExit(f"{source}: not found; --llm-tpu must be a checkout of LLM-TPU")
    target = work / f"chat{sysconfig.get_config_var('EXT_SUFFIX')}"
    if target.is_file() and target.stat().st_mtime > source.stat().st_mtime:
        return target
    command = ["g++", "-O2", "-std=c++17", "-shared", "-fPIC", "-DDEBUG", "-Wall",
               f"-I{llm_tpu / 'support/include'}", f"-I{pybind11.get_include()}",
               f"-I{sysconfig.get_paths()['include']}", str(source), f"-L{libs}", f"-Wl,-rpath,{libs}",
               "-lbmrt", "-lbmlib", "-o", str(target)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"g++ {source} failed:\n{done.stderr[-3000:]}")
    return target


def llmtpu_ids(module_dir: Path, libs: Path, bmodel: Path, turns: list[list[int]], steps: int) -> dict:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LD_")}, "LD_LIBRARY_PATH": str(libs)}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(module_dir), str(bmodel), str(steps), json.dumps(turns)],
                          capture_output=True, text=True, env=env, timeout=3600)
    line = next((x for x in done.stdout.splitlines() if x.startswith("IDS ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"LLM-TPU's chat on {bmodel} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(line[4:])


# llmbuild's driver (runtime/bmodel_generate.py) on the same turns. With `bookkeeping`, a later turn of a
# history bmodel is kept as chat.cpp keeps it, to show that the nets compute what chat.cpp's do and that a
# different turn comes from the cache bookkeeping alone: chat.cpp counts the previous turn's last token in
# `history_length` without computing its K/V (its cache row stays zero), and `forward_next` writes each new
# K/V at `token_length - 1`, the position within the turn, not in the conversation.
LLMBUILD_DRIVER = """
import json, sys
import numpy as np
from llmbuild.runtime import bmodel_generate as G
from llmbuild.runtime.bmodel_cmodel import CmodelRuntime, bmodel_chip
from llmbuild.vendor_toolchain import locate
path, steps, turns, bookkeeping = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4] == "1"

def chat_cpp_turn(lm, rt, turn):
    lm._cached.append(lm._pending)
    lm._pending = None
    out = [lm._feed(turn)]
    while len(out) < steps:
        p, s, token = len(lm._cached), lm.seqlen, out[-1]
        x = rt.launch("embedding_cache", [np.array([[token]], np.int32)], convert=False)[0]
        src = lm.embed_cache.outputs[0]
        visible = np.ones(s + 1, bool)
        visible[p:s] = False
        row = len(turn) + len(out) - 1
        for i, net in enumerate(lm.blocks_cache):
            h, mask = G._recast(x, src, net.inputs[0]), lm._mask(net.inputs[2], 1, s + 1, visible)
            x, k, v = rt.launch(net.name, [h, np.array([[p]], np.int32), mask, lm._k[i], lm._v[i]], convert=False)
            lm._k[i][:, row] = G._recast(k[:, 0], net.outputs[1], net.inputs[3])
            lm._v[i][:, row] = G._recast(v[:, 0], net.outputs[2], net.inputs[4])
            src = net.outputs[0]
        lm._cached.append(token)
        out.append(lm._lm_head(x, src))
    return out

with CmodelRuntime(locate().lib, bmodel_chip(path)) as rt:
    rt.load(path)
    lm, out = G.BmodelLM(rt), []
    for k, turn in enumerate(turns):
        out.append(chat_cpp_turn(lm, rt, turn) if bookkeeping and k else lm.generate(turn, steps))
print("IDS " + json.dumps(out), flush=True)
"""


def llmbuild_ids(bmodel: Path, turns: list[list[int]], steps: int, bookkeeping: bool = False) -> list[list[int]]:
    """The same turns through llmbuild's driver, in a process of its own (a process holds one simulator)."""
    done = subprocess.run([sys.executable, "-c", LLMBUILD_DRIVER, str(bmodel), str(steps), json.dumps(turns),
                           "1" if bookkeeping else "0"], capture_output=True, text=True, cwd=ROOT, timeout=3600)
    line = next((x for x in done.stdout.splitlines() if x.startswith("IDS ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"llmbuild's driver on {bmodel} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(line[4:])


def ids_arg(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llm-tpu", type=Path, required=True, help="a checkout of LLM-TPU")
    ap.add_argument("--bmodel", type=Path, required=True)
    ap.add_argument("--prompt-ids", type=ids_arg, required=True)
    ap.add_argument("--turn", type=ids_arg, action="append", default=[], help="a later turn's ids (repeat)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "llmtpu_chat")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    chip = bmodel_chip(args.bmodel)
    if chip is None:
        raise SystemExit(f"{args.bmodel}: expected a BM1684X or BM1688 bmodel")
    args.work.mkdir(parents=True, exist_ok=True)
    libs = link_chip_libraries(locate().lib, chip, args.work / f"lib-{chip}")
    module = build_module(args.llm_tpu.resolve(), libs, args.work)
    turns = [args.prompt_ids, *args.turn]
    theirs = llmtpu_ids(module.parent, libs, args.bmodel.resolve(), turns, args.steps)
    ours = llmbuild_ids(args.bmodel.resolve(), turns, args.steps)
    result = {"bmodel": str(args.bmodel), "chip": chip, "history_nets": theirs["history"], "turns": turns,
              "llm_tpu_chat": theirs["ids"], "llmbuild": ours, "equal": theirs["ids"] == ours}
    rows = [("llmbuild run --bmodel", ours)]
    if theirs["history"] and len(turns) > 1:
        kept = llmbuild_ids(args.bmodel.resolve(), turns, args.steps, bookkeeping=True)
        result["llmbuild_with_chat_cpp_bookkeeping"] = kept
        result["equal_with_chat_cpp_bookkeeping"] = theirs["ids"] == kept
        rows.append(("llmbuild, chat.cpp's cache bookkeeping", kept))
    for k, want in enumerate(theirs["ids"]):
        print(f"turn {k + 1}: LLM-TPU chat.cpp {want}")
        for label, got in rows:
            print(f"    {label}: {got[k]} {'equal' if got[k] == want else 'DIFFERENT'}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["equal"] or result.get("equal_with_chat_cpp_bookkeeping") else 1


if __name__ == "__main__":
    sys.exit(main())

"""`llmbuild inspect FILE.bmodel`: a vendor bmodel's nets, their inputs and outputs, and device memory, as
the vendor's `model_tool --info` reports them (printed as it is, or as JSON with `--json`)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from llmbuild import LlmbuildError
from llmbuild.vendor_toolchain import locate

_NET = re.compile(r"^net (\d+): \[(.+?)\]\s+(\w+)", re.M)
_TENSOR = re.compile(r"^(input|output): (\S+), \[([^\]]*)\], (\w+)", re.M)
_MEMORY = re.compile(r"^device mem size: (\d+) \(weight: (\d+), instruct: (\d+), runtime: (\d+)\)", re.M)


def model_info(path: str | Path) -> str:
    """`model_tool --info`'s text for `path`."""
    chain = locate()
    path = Path(path)
    if not path.is_file():
        raise LlmbuildError(f"{path}: no such bmodel file")
    done = subprocess.run([str(chain.model_tool), "--info", str(path)], capture_output=True, text=True,
                          env=chain.environment(path.parent.resolve(), path.parent.resolve()), check=False)
    if done.returncode != 0 or "net 0:" not in done.stdout:
        said = (done.stderr or done.stdout).strip()[:200]
        raise LlmbuildError(f"{path}: model_tool --info could not read it ({said})")
    return done.stdout


def parse_info(text: str) -> dict:
    """The nets (with each stage's inputs and outputs) and the device memory of `model_tool --info`'s text."""
    nets = []
    starts = [m.start() for m in _NET.finditer(text)] + [len(text)]
    for m, end in zip(_NET.finditer(text), starts[1:], strict=True):
        body = text[m.start():end]
        tensors = [{"kind": k, "name": n, "shape": [int(d) for d in s.split(",") if d.strip()], "dtype": t}
                   for k, n, s, t in _TENSOR.findall(body)]
        nets.append({"name": m.group(2), "kind": m.group(3),
                     "inputs": [t for t in tensors if t["kind"] == "input"],
                     "outputs": [t for t in tensors if t["kind"] == "output"]})
    memory = _MEMORY.search(text)
    device = None if memory is None else dict(zip(("total", "weight", "instruct", "runtime"),
                                                  map(int, memory.groups()), strict=True))
    chip = re.search(r"^chip: (\S+)", text, re.M)
    return {"chip": chip.group(1) if chip else None, "nets": nets, "device_memory_bytes": device}


def inspect_bmodel(path: str | Path, as_json: bool = False) -> str:
    text = model_info(path)
    return json.dumps(parse_info(text), indent=1) if as_json else text.rstrip()


__all__ = ["inspect_bmodel", "model_info", "parse_info"]

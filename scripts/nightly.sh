#!/usr/bin/env bash
# The nightly model zoo (README, "The nightly zoo"; docs/zoo.md): build every recipe with
# `snakemake zoo`, which writes <build>/zoo/index.html and one history record, then exit 1 when this run
# regressed against the previous one (`llmbuild zoo-check` lists each regression).
#
#   scripts/nightly.sh [snakemake options...]     e.g. --config 'recipes=[qwen2_tiny_f32,llama_tiny_f32]'
#
# The build goes to $LLMBUILD_BUILD_DIR (default build/): set it there rather than with --config build_dir,
# so that the check reads the same zoo. LLMBUILD_NIGHTLY_CORES: cores to use (default: all).
# Exit status: 0 no regression, 1 a regression, 2 the zoo run itself failed.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then
    . .venv/bin/activate
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cores=${LLMBUILD_NIGHTLY_CORES:-$(nproc)}
zoo="${LLMBUILD_BUILD_DIR:-build}/zoo"

if ! snakemake --cores "$cores" zoo "$@"; then
    echo "nightly: the zoo run did not complete (a recipe's failure would not stop it: see above)" >&2
    exit 2
fi
echo "nightly: $zoo/index.html"
llmbuild zoo-check "$zoo"

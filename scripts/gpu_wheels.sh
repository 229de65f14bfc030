#!/usr/bin/env bash
# Run on a machine WITH network access, before scripts/gpu_check.sh runs on the GPU machine (which has
# none): downloads wheels for CPython 3.12 of scripts/gpu_requirements.txt (cgvm's core and pytest, a few
# MB) and, unless --core, scripts/gpu_requirements_peers.txt (test extras and peers, ~190 MB), with
# their dependencies, into a folder (./wheels by default; git ignores it) that travels with the checkout.
#
#   scripts/gpu_wheels.sh [--core] [WHEEL_DIR]
#
# GPU_WHEELS_PLATFORM (default manylinux_2_28_x86_64; aarch64 machines such as GH200:
# manylinux_2_28_aarch64) is the GPU machine's platform. CuPy and PyTorch are not downloaded: the GPU
# machine has them (cupy-cuda13x, torch with CUDA), and their wheels are gigabytes.
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=(-r scripts/gpu_requirements.txt -r scripts/gpu_requirements_peers.txt)
if [ "${1:-}" = "--core" ]; then FILES=(-r scripts/gpu_requirements.txt); shift; fi
DEST=${1:-wheels}
PLATFORM=${GPU_WHEELS_PLATFORM:-manylinux_2_28_x86_64}
ARCH=${PLATFORM##*_2_28_}
mkdir -p "$DEST"
# older manylinux tags run on the newer platform too: list them so pip takes either
pip download --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --only-binary=:all: --platform "$PLATFORM" --platform "manylinux2014_$ARCH" \
    --platform "manylinux_2_17_$ARCH" --platform any -d "$DEST" "${FILES[@]}"
echo "wheels for CPython 3.12 ($PLATFORM) in $DEST: $(ls "$DEST" | wc -l) files, $(du -sh "$DEST" | cut -f1)"

#!/usr/bin/env bash
# Builds this tree on the GPU machine (pip LibTorch 2.x + CUDA, the carried
# Debian packages of .device/): configures BUILD_DIR once and builds the
# given targets (all when none is named), Release, all cores. Run after
# `source .device/env.sh` (shared/device/README.md); keep BUILD_DIR outside
# the checkout, e.g. /tmp/build.
#
#   tools/device_build.sh BUILD_DIR [target ...]
set -euo pipefail
BUILD=${1:?build dir}; shift
SRC=$(cd "$(dirname "$0")/.." && pwd)
: "${DEVICE_CMAKE_ARGS:?source .device/env.sh first}"
start=$(date +%s)
# shellcheck disable=SC2086
[ -f "$BUILD/build.ninja" ] || cmake -S "$SRC" -B "$BUILD" -G Ninja $DEVICE_CMAKE_ARGS \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > "$BUILD.configure.log" 2>&1 ||
  { tail -30 "$BUILD.configure.log"; exit 1; }
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$BUILD" -j"$(nproc)" "${targets[@]}" > "$BUILD.build.log" 2>&1 ||
  { grep -E "error|Error" "$BUILD.build.log" | head -30; tail -20 "$BUILD.build.log"; exit 1; }
echo "device_build: ${*:-all} built in $(( $(date +%s) - start ))s"

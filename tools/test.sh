#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, and runs every
# CPU test. Then rebuilds the LibTorch-free code with ASan+UBSan and runs
# its tests under the sanitizers. GPU tests (label `gpu`) are excluded here:
# on CPU they would only skip, and a skip is not a pass.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/install_deps.sh
JOBS=${JOBS:-$(nproc)}
# Let ccache hit across checkouts in different directories.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
start=$(date +%s)

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG"
cmake --build build -j"$JOBS"
ctest --test-dir build --output-on-failure -j"$JOBS" -LE gpu --timeout 900

# Sanitizers: the code that does not load LibTorch (parsers, tokenizer,
# data, safetensors) is where hostile input arrives.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DE3_SANITIZE=ON -DE3_WITH_TORCH=OFF \
  -DE3_BUILD_BENCH=OFF
cmake --build build-asan -j"$JOBS"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  LSAN_OPTIONS=suppressions=$PWD/tools/lsan.supp \
  ctest --test-dir build-asan --output-on-failure -j"$JOBS" -L notorch -LE gpu --timeout 900

echo "tools/test.sh: all CPU tests passed in $(( $(date +%s) - start ))s"

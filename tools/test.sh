#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, and runs every
# CPU test. Then rebuilds the LibTorch-free code with ASan+UBSan and runs
# its tests and fuzz harnesses under the sanitizers, and the teacher's
# threaded core under ThreadSanitizer. GPU tests (label `gpu`) are
# excluded here: on CPU they would only skip, and a skip is not a pass.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/install_deps.sh
# Debian's BLIS runs its portable kernels on CPUs newer than itself (AMD
# Zen 5): tools/blis_arch.py names the tuned ones it should take instead.
eval "$(python3 tools/blis_arch.py)"
JOBS=${JOBS:-$(nproc)}
# Let ccache hit across checkouts in different directories.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
start=$(date +%s)
# Prints how long each phase took, so that CI's 25-minute budget can be
# kept by knowing where the time goes.
phase_start=$start
phase_done() {
  local now
  now=$(date +%s)
  echo "tools/test.sh: phase '$1' took $(( now - phase_start ))s"
  phase_start=$now
}

# Without the `gpu`-labelled tests (they could only skip here; the GPU
# machine builds and runs them) and the benchmarks (CI runs none); the
# libraries as unity sources (E3_UNITY_BUILD), and each folder's unit
# tests as one binary of unity sources (E3_GROUPED_TESTS); see
# docs/decisions/0018-what-ci-builds-and-runs.md and
# docs/decisions/0019-fitting-ci-into-its-budget.md.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DE3_BUILD_GPU_TESTS=OFF -DE3_BUILD_BENCH=OFF -DE3_UNITY_BUILD=ON -DE3_GROUPED_TESTS=ON
cmake --build build -j"$JOBS"
phase_done "main build"
ctest --test-dir build --output-on-failure -j"$JOBS" -LE gpu --timeout 900
phase_done "main tests"

# Sanitizers, built by clang-14 (libFuzzer and TSan come with it).
# ASan+UBSan: the code that does not load LibTorch (parsers, tokenizer,
# data, safetensors, the wire limits, the trainer state) is where hostile
# input arrives. Its tests run under the sanitizers, each fuzz harness
# replays its committed corpus (a ctest), then runs FUZZ_SECONDS more.
cmake -S . -B build-asan -G Ninja -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" \
  -DE3_SANITIZE=ON -DE3_FUZZ=ON -DE3_WITH_TORCH=OFF -DE3_BUILD_BENCH=OFF -DE3_BUILD_GPU_TESTS=OFF \
  -DE3_GROUPED_TESTS=ON
cmake --build build-asan -j"$JOBS"
phase_done "asan build"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  LSAN_OPTIONS=suppressions=$PWD/tools/lsan.supp \
  ctest --test-dir build-asan --output-on-failure -j"$JOBS" -L notorch -LE gpu --timeout 900
./tools/fuzz.sh --seconds "${FUZZ_SECONDS:-10}" --jobs "$JOBS" build-asan
phase_done "asan tests and fuzzing"

# ThreadSanitizer on the threads whose hand-offs are ours: the teacher's
# engine (worker, subscriptions, acks, notifier), its service on loopback
# (Generate threads, the engine behind the streams), the dataset's
# tokenizer pool, the metrics server, the student's client (stream
# reader, prefetch, acks) and a CPU end-to-end run of both binaries. The
# student's part builds its LibTorch library a third time; TSAN_STUDENT=0
# leaves it out for a quicker run (docs/decisions/0018-what-ci-builds-and-runs.md).
tsan_targets=(engine_test teacher_service_test service_limits_test dataset_test metrics_server_test)
tsan_tests='EngineTest|TeacherServiceTest|ServiceLimitsTest|BatchIdTest|DatasetTest|MetricsServerTest'
if [[ "${TSAN_STUDENT:-1}" == 1 ]]; then
  tsan_targets+=(teacher_client_test train_e2e_test)
  tsan_tests+='|TeacherClientLimitsTest|TrainE2eTest'
  # One of the random-model teachers (DeepSeek-V3) as well.
  # (ctest names a parameterised case `<name>  # GetParam() = <fixture>`.)
  tsan_only='|/RandomTeacherTrainE2eTest\.[A-Za-z]+/rand_deepseek_v3( |$)'
fi
cmake -S . -B build-tsan -G Ninja -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -gline-tables-only -DNDEBUG" \
  -DE3_TSAN=ON -DE3_BUILD_BENCH=OFF -DE3_BUILD_GPU_TESTS=OFF -DE3_UNITY_BUILD=ON
cmake --build build-tsan -j"$JOBS" --target "${tsan_targets[@]}"
phase_done "tsan build"
TSAN_OPTIONS="suppressions=$PWD/tools/tsan.supp" \
  ctest --test-dir build-tsan --output-on-failure -j"$JOBS" --timeout 900 -R "^(${tsan_tests})\.${tsan_only:-}"

phase_done "tsan tests"
echo "tools/test.sh: all CPU tests passed in $(( $(date +%s) - start ))s"

#!/usr/bin/env bash
# Runs every libFuzzer harness of a build (cmake -DE3_FUZZ=ON, see
# tools/test.sh) for a bounded time each, from its committed corpus
# (tests/fuzz/corpus/<name>), and prints one line per harness: seconds,
# executions, corpus size. A crash stops with its input saved as
# tests/fuzz/corpus/<name>/crash-<sha1>, the regression case to keep once
# fixed. tests/fuzz/dict/<name>.dict, when present, lists the format's
# keywords for libFuzzer's mutations.
#
#   tools/fuzz.sh [--seconds N] [--jobs J] [--merge] BUILD_DIR [NAME...]
#
# --seconds  per harness (default $FUZZ_SECONDS, else 20); CI's budget.
#            Long local runs: --seconds 1800.
# --jobs     harnesses run side by side (default 2: the CI machine's cores).
# --merge    fold the inputs that reached new coverage back into the
#            committed corpus (minimized), to commit after long runs.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-20}
jobs=2
merge=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --merge) merge=1; shift ;;
    *) break ;;
  esac
done
build=${1:?usage: tools/fuzz.sh [--seconds N] [--jobs J] [--merge] BUILD_DIR [NAME...]}
shift
names=("$@")
if ((${#names[@]} == 0)); then
  for f in "$build"/tests/fuzz/*_fuzz; do names+=("$(basename "$f")"); done
fi
root=$PWD
# The harnesses write each input to a file (the parsers take paths):
# tmpfs keeps that cheap.
[[ -z "${TMPDIR:-}" && -d /dev/shm ]] && export TMPDIR=/dev/shm
work=$(mktemp -d "${TMPDIR:-/tmp}/e3-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The embedded CPython is never finalized; its heap is not a leak of ours
# (tools/lsan.supp). UBSan findings abort, so libFuzzer keeps the input.
export LSAN_OPTIONS="suppressions=$root/tools/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

run_one() {
  local name=$1 corpus=$root/tests/fuzz/corpus/$1
  mkdir -p "$work/$name"
  # -timeout: one input may take this long (the templates run in
  # CPython); -rss_limit_mb: a parser that allocates past this is a
  # finding. New inputs go to the scratch dir; crashes to the corpus.
  local rc=0 dict=()
  [[ -f "$root/tests/fuzz/dict/$name.dict" ]] && dict=(-dict="$root/tests/fuzz/dict/$name.dict")
  "$build/tests/fuzz/$name" "$work/$name" "$corpus" "${dict[@]}" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 -artifact_prefix="$corpus/" >"$work/$name.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$name.rc"
}

failed=0
running=0
for name in "${names[@]}"; do
  run_one "$name" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait
for name in "${names[@]}"; do
  if [[ "$(cat "$work/$name.rc")" != 0 ]]; then
    failed=1
    echo "fuzz: $name FAILED; its log:"
    tail -60 "$work/$name.log"
    ls "tests/fuzz/corpus/$name" | grep -E '^(crash|leak|timeout|oom|slow-unit)-' | sed "s|^|  kept: tests/fuzz/corpus/$name/|" || true
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$name.log" | grep -o '[0-9]*$' || echo 0)
  corpus=$(ls "$work/$name" | wc -l)
  seeds=$(ls "tests/fuzz/corpus/$name" | wc -l)
  printf 'fuzz: %-20s %5ss %10s execs  %4s committed + %4s new inputs\n' "$name" "$seconds" "$execs" "$seeds" "$corpus"
  if ((merge)) && ((failed == 0)); then
    "$build/tests/fuzz/$name" -merge=1 "tests/fuzz/corpus/$name" "$work/$name" >"$work/$name.merge.log" 2>&1
  fi
done
exit "$failed"

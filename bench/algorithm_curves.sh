#!/usr/bin/env bash
# The three draft algorithms (EAGLE-3, EAGLE-3.1, DFlash with its decay and
# D-PACE losses) trained on the bundled tiny-code-llama with the same data,
# seed, steps and batch, one launch each of the demo's run config
# (examples/configs/demo.yaml: one teacher and one student on the CPU), the
# real acceptance length measured every $EVAL_EVERY steps and at the end;
# then bench/plot_algorithms.py draws loss and real tau against step into
# $PNG and prints a table per run. A measurement the teacher's eval set is
# not ready for yet (it is generated in the background while the student
# trains) is skipped, not waited for: on 2 busy cores the faster DFlash
# students reach step 20 before it is ready, hence every 10 steps.
#
#   bench/algorithm_curves.sh                  # 7-11 minutes on 2 cores
#   STEPS=40 EVAL_EVERY=10 OUT=/tmp/curves bench/algorithm_curves.sh
#
# $OUT (default ./algorithm-curves) holds one launcher run.out per run
# (steps.jsonl, summary-0.json, run.yaml, teacher-0.log, student-0.log,
# run.png, the export) and <name>.launch.log. A run whose summary-0.json
# exists is kept, not run again (delete its directory to redo it); an
# unfinished one is removed and started over. $BUILD (default build/)
# holds the binaries; $RUNS_OVERRIDE ("name|overrides;...") replaces the
# list of runs.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${BUILD:-$SRC/build}" && pwd)
OUT=${OUT:-$PWD/algorithm-curves}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STEPS=${STEPS:-80}
EVAL_EVERY=${EVAL_EVERY:-10}
TOKENS_PER_BATCH=${TOKENS_PER_BATCH:-1024}
EVAL_PROMPTS=${EVAL_PROMPTS:-32}
EVAL_TOKENS=${EVAL_TOKENS:-128}
PNG=${PNG:-$SRC/bench/algorithm_curves.png}
PYTHON=${PYTHON:-/usr/bin/python3}

DFLASH="draft.algorithm=dflash draft.dflash_layers=3 draft.dflash_block_size=8 draft.dflash_num_anchors=128"
# name|run config overrides
RUNS=(
  "eagle3|draft.algorithm=eagle3"
  "eagle3.1|draft.algorithm=eagle3.1"
  "dflash|$DFLASH"
  "dflash-dpace|$DFLASH draft.dflash_loss=dpace"
)
if [ -n "${RUNS_OVERRIDE:-}" ]; then IFS=';' read -ra RUNS <<< "$RUNS_OVERRIDE"; fi

# The run config's paths are relative to the repository root.
cd "$SRC"
dirs=()
for run in "${RUNS[@]}"; do
  name=${run%%|*}
  overrides=${run#*|}
  dir="$OUT/$name"
  dirs+=("$dir")
  if [ -f "$dir/summary-0.json" ]; then
    echo "$name: kept (its summary exists: $dir)"
    continue
  fi
  rm -rf "$dir"
  echo "$name: $overrides"
  start=$(date +%s)
  # shellcheck disable=SC2086
  if ! "$BUILD/launcher/e3_launch" --config=examples/configs/demo.yaml run.out="$dir" \
      schedule.max_steps="$STEPS" schedule.tokens_per_batch="$TOKENS_PER_BATCH" schedule.lr=1e-3 \
      schedule.eval_every="$EVAL_EVERY" data.eval_samples="$EVAL_PROMPTS" \
      data.eval_max_new_tokens="$EVAL_TOKENS" $overrides > "$OUT/$name.launch.log" 2>&1; then
    echo "$name failed:"
    tail -20 "$OUT/$name.launch.log"
    exit 1
  fi
  echo "$name: $(( $(date +%s) - start )) s wall"
  grep -E "acceptance" "$dir/student-0.log" | sed "s/^/  /" || true
done

"$PYTHON" "$SRC/bench/plot_algorithms.py" --out="$PNG" "${dirs[@]}"

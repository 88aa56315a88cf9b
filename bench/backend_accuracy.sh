#!/usr/bin/env bash
# The backends' training comparison: the same draft trained against the hf and
# the sgl teacher backends, same seeds and data, on tiny-code-llama, then
# acc_j at every TTT step j averaged over the last 100 steps of each run
# (bench/plot_backend_accuracy.py prints the table, checks |delta acc_j| <=
# 0.5 points and draws the PNG). A second hf run with the same seeds is the
# noise floor: what GPU nondeterminism alone (atomics in the backward)
# moves the curves by.
#
# With MODE=kernels the same comparison holds the student's
# fast step against its reference step instead, both behind the sgl
# teacher: runs reference, fast and fast_repeat.
#
#   bench/backend_accuracy.sh BUILD_DIR RUN_DIR [STEPS] [DEVICE] [MODE]
# All runs go at once, each pair (teacher + student) on DEVICE (default
# cuda:0): the tiny model leaves the GPU mostly idle, so they do not slow
# each other down much, and the data order does not depend on timing.
set -euo pipefail
BUILD=${1:?build dir}; RUN=${2:?run dir}; STEPS=${3:-1200}; DEVICE=${4:-cuda:0}; MODE=${5:-backend}
SRC=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$RUN"
pids=()
teachers=()
# On any exit (a teacher that did not start included), stop every process started here.
trap 'kill "${pids[@]}" "${teachers[@]}" 2>/dev/null || true' EXIT
start_pair() {  # name backend student_kernels
  local name=$1 backend=$2 kernels=$3 dir="$RUN/$1"
  rm -rf "$dir" && mkdir -p "$dir"
  "$BUILD/teacher_server/teacher_server" --model_dir="$SRC/examples/tiny-code-llama" \
    --data="$SRC/examples/data/train_conversations.jsonl" --backend="$backend" --device="$DEVICE" \
    --max_seq_len=512 --tokens_per_batch=2048 --draft_vocab_size=2048 --epochs=20 \
    --listen=127.0.0.1:0 --port_file="$dir/teacher.port" --metrics_port=-1 > "$dir/teacher.log" 2>&1 &
  local teacher=$!
  teachers+=($teacher)
  for _ in $(seq 600); do [ -s "$dir/teacher.port" ] && break; sleep 0.2; done
  [ -s "$dir/teacher.port" ] || { echo "$name: teacher did not start"; tail -20 "$dir/teacher.log"; exit 1; }
  ( set +e
    "$BUILD/student_trainer/student_trainer" --teacher=127.0.0.1:$(head -1 "$dir/teacher.port") --device="$DEVICE" \
      --max_steps="$STEPS" --lr=1e-3 --warmup_steps=20 --init_seed=0 --log_every=200 --metrics_port=-1 \
      --student_kernels="$kernels" \
      --step_log="$dir/steps.jsonl" --summary_json="$dir/summary.json" > "$dir/student.log" 2>&1
    rc=$?; kill $teacher 2>/dev/null; exit $rc ) &
  pids+=($!)
}
if [ "$MODE" = kernels ]; then
  names=(reference fast fast_repeat)
  start_pair reference sgl reference
  start_pair fast sgl fast
  start_pair fast_repeat sgl fast
else
  names=(hf sgl hf_repeat)
  start_pair hf hf fast
  start_pair sgl sgl fast
  start_pair hf_repeat hf fast
fi
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
for n in "${names[@]}"; do echo "== $n"; grep -E "step [0-9]+/|rror" "$RUN/$n/student.log" | tail -3 || true; done
[ $failed = 0 ] || { echo "a run failed"; exit 1; }

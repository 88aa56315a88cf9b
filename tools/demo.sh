#!/usr/bin/env bash
# The README's main-job command: installs dependencies, builds the two
# services, starts a teacher on the bundled tiny-code-llama and its training
# conversations, trains one student against it for a few minutes, and
# prints the summary (loss, acc_0..acc_6 and the simulated tau at the start
# and the end, tokens/s, the real acceptance length tau of the trained draft
# against the untrained one on the bundled eval prompts, where the exported
# draft is).
#
# Knobs (environment): DEMO_STEPS (default 80), DEMO_TOKENS_PER_BATCH (1024),
# DEMO_LR (1e-3), DEMO_DIR (run directory, default ./demo-run), DEMO_EVAL_PROMPTS
# (eval prompts the teacher continues, default 32 of the 100), DEMO_EVAL_TOKENS
# (tokens it generates for each, default 128).
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/install_deps.sh
JOBS=${JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" >/dev/null
cmake --build build -j"$JOBS" --target teacher_server student_trainer

STEPS=${DEMO_STEPS:-80}
TOKENS=${DEMO_TOKENS_PER_BATCH:-1024}
LR=${DEMO_LR:-1e-3}
RUN=${DEMO_DIR:-demo-run}
rm -rf "$RUN" && mkdir -p "$RUN"

./build/teacher_server/teacher_server \
  --model_dir=examples/tiny-code-llama \
  --data=examples/data/train_conversations.jsonl \
  --max_seq_len=512 --tokens_per_batch="$TOKENS" --draft_vocab_size=2048 \
  --listen=127.0.0.1:0 --port_file="$RUN/teacher.port" --ledger="$RUN/ledger.jsonl" \
  --eval_prompts=examples/data/eval_prompts.jsonl --eval_samples="${DEMO_EVAL_PROMPTS:-32}" \
  --eval_max_new_tokens="${DEMO_EVAL_TOKENS:-128}" \
  --threads=1 >"$RUN/teacher.log" 2>&1 &
TEACHER=$!
trap 'kill $TEACHER 2>/dev/null || true' EXIT
for _ in $(seq 600); do [[ -s "$RUN/teacher.port" ]] && break; sleep 0.1; done
if [[ ! -s "$RUN/teacher.port" ]]; then
  echo "teacher did not start; its log:"; cat "$RUN/teacher.log"; exit 1
fi
PORT=$(cat "$RUN/teacher.port")
grep '^teacher:' "$RUN/teacher.log" || true
echo "demo: training $STEPS steps of ~$TOKENS tokens against the teacher on 127.0.0.1:$PORT"

./build/student_trainer/student_trainer \
  --teacher="127.0.0.1:$PORT" --max_steps="$STEPS" --lr="$LR" --warmup_steps=4 \
  --checkpoint_dir="$RUN/checkpoints" --checkpoint_every=40 \
  --output_dir="$RUN/draft" --summary_json="$RUN/summary.json" \
  --log_every=10 --threads=1 --step_log="$RUN/steps.jsonl"

kill -TERM $TEACHER 2>/dev/null || true
wait $TEACHER 2>/dev/null || true
trap - EXIT
echo "demo: teacher log $RUN/teacher.log; ledger $RUN/ledger.jsonl; summary $RUN/summary.json"
echo "demo: exported EAGLE-3 draft (config.json + model.safetensors): $RUN/draft"

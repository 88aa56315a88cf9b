#!/usr/bin/env bash
# What each training choice does to the real acceptance length,
# on the bundled tiny-code-llama and examples/data/eval_prompts.jsonl: one
# teacher (its eval set: greedy continuations of the 100 prompts, 256 tokens
# each, KV cache), then one student per choice, each from the same seed and
# the same data (a fresh student starts the teacher's stream at its
# beginning): 2048-token batches, draft vocab 2048, lr 1e-3, tau measured
# every $EVAL_EVERY steps and at the end. The last run checks the final
# draft against tools/acceptance_crosscheck.py (the serving way, one token
# at a time with a KV cache) on the same device.
#
#   bench/acceptance_choices.sh BUILD_DIR [cuda:0]
# The teacher waits for a --regenerate pass before it serves (its log says
# how long and how fast). Results: $OUT (or ./acceptance-choices) holds choices.tar.gz: each run's
# summary and step log, the teacher log and the cross-check's JSON; the
# table is printed at the end. bench/plot_acceptance.py draws the curve.
set -euo pipefail
BUILD=${1:?build dir}
DEVICE=${2:-cuda:0}
SRC=$(cd "$(dirname "$0")/.." && pwd)
RES=${OUT:-$PWD/acceptance-choices}
STEPS=${STEPS:-1200}
EVAL_EVERY=${EVAL_EVERY:-200}
RUN=$(mktemp -d)
mkdir -p "$RES"
# Packs what exists so far: a run cut short still brings back its results.
pack() { tar -czf "$RES/choices.tar.gz" -C "$RUN" $(cd "$RUN" && ls *.json *.jsonl *.log 2>/dev/null); }

# $TEACHER_ARGS: extra teacher flags (e.g. --regenerate); its data is $DATA.
# shellcheck disable=SC2086
"$BUILD/teacher_server/teacher_server" --model_dir="$SRC/examples/tiny-code-llama" \
  --data="${DATA:-$SRC/examples/data/train_conversations.jsonl}" --device="$DEVICE" --max_seq_len=2048 ${TEACHER_ARGS:-} \
  --tokens_per_batch=2048 --draft_vocab_size=2048 --epochs=20 \
  --eval_prompts="$SRC/examples/data/eval_prompts.jsonl" --eval_max_new_tokens="${EVAL_TOKENS:-256}" --eval_samples="${EVAL_PROMPTS:-0}" \
  --listen=127.0.0.1:0 --port_file="$RUN/port" --metrics_port=-1 > "$RUN/teacher.log" 2>&1 &
TEACHER=$!
trap 'kill $TEACHER 2>/dev/null || true' EXIT
for _ in $(seq $((${PORT_WAIT_S:-120} * 5))); do [ -s "$RUN/port" ] && break; sleep 0.2; done
[ -s "$RUN/port" ] || { echo "teacher did not start:"; tail -20 "$RUN/teacher.log"; exit 1; }
PORT=$(head -1 "$RUN/port")

CROSS=""
# name|student flags
CHOICES=(
  "default|"
  "fixed_positions|--ttt_positions=fixed"
  "beta2_0.999|--adam_beta2=0.999"
  "steps_x3|--max_steps=$((3 * STEPS))"
  "floor_0|--min_lr_ratio=0"
  "floor_0.5|--min_lr_ratio=0.5"
  "lk_alpha|--ttt_loss=lk_alpha"
  "lk_lambda|--ttt_loss=lk_lambda"
)
# $CHOICES_OVERRIDE: "name|flags;name|flags" replaces the list (the first
# is the baseline of the table).
if [ -n "${CHOICES_OVERRIDE:-}" ]; then IFS=';' read -ra CHOICES <<< "$CHOICES_OVERRIDE"; fi
for choice in "${CHOICES[@]}"; do
  name=${choice%%|*}
  flags=${choice#*|}
  extra=()
  [ "$name" = default ] && extra=(--eval_dump="$RUN/default.eval.safetensors" --output_dir="$RUN/default.draft"
                                  --export_dtype=float32)
  # shellcheck disable=SC2086
  "$BUILD/student_trainer/student_trainer" --teacher=127.0.0.1:$PORT --device="$DEVICE" --max_steps="$STEPS" \
    --lr=1e-3 --eval_every="$EVAL_EVERY" --log_every=200 --metrics_port=-1 --subscriber_id="$name" \
    --summary_json="$RUN/$name.summary.json" --step_log="$RUN/$name.steps.jsonl" "${extra[@]}" $flags \
    > "$RUN/$name.log" 2>&1 || { echo "$name failed:"; tail -20 "$RUN/$name.log"; }
  grep -E "acceptance \(final\)|untrained draft|summary" "$RUN/$name.log" | sed "s/^/$name: /" || true
  pack
  if [ "$name" = default ]; then
    # The serving-way measurement of the same draft, alongside the other runs.
    "${PYTHON:-python3}" "$SRC/tools/acceptance_crosscheck.py" --draft="$RUN/default.draft" \
      --eval_dump="$RUN/default.eval.safetensors" --device="${DEVICE%%:*}" --json_out="$RUN/crosscheck.json" \
      > "$RUN/crosscheck.log" 2>&1 &
    CROSS=$!
  fi
done
grep -E "eval set ready" "$RUN/teacher.log" || true

if [ -n "$CROSS" ]; then
  if wait "$CROSS"; then echo "cross-check passed"; else echo "cross-check FAILED"; fi
  tail -5 "$RUN/crosscheck.log"
else
  echo "cross-check not run (no \"default\" choice)"
fi

"${PYTHON:-python3}" - "$RUN" "${CHOICES[@]}" <<'PY'
import json, sys, os
run, choices = sys.argv[1], sys.argv[2:]
base = None
print("| choice | real tau chain 3 / 5 / 7 | vs default (chain 7) | simulated tau (last window) | untrained chain 7 |")
print("|---|---|---|---|---|")
for c in choices:
    name = c.split("|")[0]
    path = os.path.join(run, name + ".summary.json")
    if not os.path.exists(path):
        print(f"| {name} | failed | | | |"); continue
    s = json.load(open(path))
    e, u = s.get("eval"), s.get("eval_untrained")
    if e is None:
        print(f"| {name} | no eval | | | |"); continue
    t = e["tau"]
    if base is None: base = t["7"]
    print(f"| {name} | {t['3']:.3f} / {t['5']:.3f} / {t['7']:.3f} | {t['7'] / base:.3f} | "
          f"{s['last']['simulated_tau']:.3f} | {u['tau']['7'] if u else float('nan'):.3f} |")
PY
pack
echo "results: $RES/choices.tar.gz"

#!/usr/bin/env bash
# The README's main-job command: installs dependencies, builds the two
# services and the launcher, and runs the bundled demo's run config
# (examples/configs/demo.yaml): a teacher on the tiny-code-llama and its
# training conversations, one student trained against it for a couple of
# minutes, both on the CPU. The launcher shows one status line per process
# and ends with the student's summary (loss, acc_0..acc_6 and the simulated
# tau at the start and the end, tokens/s, the real acceptance length tau
# of the trained draft against the untrained one on the bundled eval
# prompts, where the exported draft is) and the run's curves (run.png).
#
# Knobs (environment): DEMO_STEPS (default 80), DEMO_TOKENS_PER_BATCH (1024),
# DEMO_LR (1e-3), DEMO_DIR (run directory, default ./demo-run), DEMO_EVAL_PROMPTS
# (eval prompts the teacher continues, default 32 of the 100), DEMO_EVAL_TOKENS
# (tokens it generates for each, default 128).
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/install_deps.sh
# Debian's BLIS runs its portable kernels on CPUs newer than itself (AMD
# Zen 5): tools/blis_arch.py names the tuned ones it should take instead.
eval "$(python3 tools/blis_arch.py)"
JOBS=${JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" >/dev/null
cmake --build build -j"$JOBS" --target teacher_server student_trainer e3_launch

RUN=${DEMO_DIR:-demo-run}
rm -rf "$RUN"
./build/launcher/e3_launch --config=examples/configs/demo.yaml \
  run.out="$RUN" \
  schedule.max_steps="${DEMO_STEPS:-80}" \
  schedule.tokens_per_batch="${DEMO_TOKENS_PER_BATCH:-1024}" \
  schedule.lr="${DEMO_LR:-1e-3}" \
  data.eval_samples="${DEMO_EVAL_PROMPTS:-32}" \
  data.eval_max_new_tokens="${DEMO_EVAL_TOKENS:-128}"
echo "demo: logs $RUN/teacher-0.log, $RUN/student-0.log; ledger $RUN/ledger-0.jsonl; summary $RUN/summary-0.json"
echo "demo: curves $RUN/run.png; exported EAGLE-3 draft (config.json + model.safetensors): $RUN/draft"

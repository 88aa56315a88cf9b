#!/usr/bin/env bash
# Produces the inputs of tools/specforge_load_check.py on the CPU: a short
# training run per draft kind on the bundled tiny-code-llama, each writing
# its export (<out>/<kind>/export: config.json + model.safetensors) and its
# eval dump (<out>/<kind>/eval.safetensors), as tests/e2e/dflash_train_e2e_test.cc
# and tests/e2e/eagle31_train_e2e_test.cc run them, with fewer samples.
#
#   tools/specforge_load_check.sh [OUT]      (default OUT: .baseline/loadcheck)
#
# Kinds: dflash (two Qwen3 layers, blocks of four) and eagle31 (EAGLE-3.1:
# fc_norm, norm_output). Uses the binaries already in $BUILD (default
# ./build); builds nothing. SAMPLES (default 24) conversations per run;
# EXPORT_DTYPE (default bfloat16, the trainer's own default; float32 as the
# e2e tests) the exported weights.
#
# Each <kind>/ also gets eval.compact.safetensors: the first COMPACT_SAMPLES
# (default 2) samples' input_ids, cu_seqlens, prompt_lengths and aux_hidden
# alone, small enough to carry to another machine (the full dump holds the
# target's embedding and head, 8 MiB each here). With it the target's
# tensors come from the bundled model, --target_dir=examples/tiny-code-llama,
# which this script checks holds exactly the dump's embed_tokens and
# target_lm_head. The checkpoints are deleted. Then, where SpecForge and
# transformers are installed:
#
#   PYTHONPATH=.baseline/specforge python3 tools/specforge_load_check.py \
#       --draft=OUT/dflash/export --eval_dump=OUT/dflash/eval.safetensors
#   PYTHONPATH=.baseline/specforge python3 tools/specforge_load_check.py \
#       --draft=OUT/dflash/export --eval_dump=OUT/dflash/eval.compact.safetensors \
#       --target_dir=examples/tiny-code-llama
#   (the same with eagle31)
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
OUT=${1:-.baseline/loadcheck}
BUILD=${BUILD:-build}
SAMPLES=${SAMPLES:-24}
EXPORT_DTYPE=${EXPORT_DTYPE:-bfloat16}
COMPACT_SAMPLES=${COMPACT_SAMPLES:-2}
PYTHON=${PYTHON:-/usr/bin/python3}  # one with torch
TEACHER=$BUILD/teacher_server/teacher_server
STUDENT=$BUILD/student_trainer/student_trainer
for bin in "$TEACHER" "$STUDENT"; do
  [ -x "$bin" ] || { echo "specforge_load_check.sh: $bin is missing: build it first" >&2; exit 2; }
done

teacher_pid=
cleanup() {
  if [ -n "$teacher_pid" ] && kill -0 "$teacher_pid" 2>/dev/null; then kill "$teacher_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT

# The first COMPACT_SAMPLES samples of <dir>/eval.safetensors without the
# target's tensors, after checking that the target model holds them.
write_compact() {
  "$PYTHON" - "$1" examples/tiny-code-llama "$COMPACT_SAMPLES" <<'PY'
import json, sys
import torch
sys.path.insert(0, "tools")
import acceptance_crosscheck as ac
import specforge_load_check as lc

folder, target, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
t, _ = ac.read_safetensors(folder + "/eval.safetensors")
cu = [int(x) for x in t["cu_seqlens"]]
k = min(k, len(cu) - 1)
end = cu[k]
compact = {"input_ids": t["input_ids"][:end], "cu_seqlens": t["cu_seqlens"][: k + 1],
           "prompt_lengths": t["prompt_lengths"][:k], "aux_hidden": t["aux_hidden"][:end]}
names = [n for n in lc.TARGET_TENSORS if n in t]
for name, value in lc.read_target_tensors(ac, target, names).items():
    if not torch.equal(value, t[name].to(torch.float32)):
        sys.exit(f"{target}: {name} differs from the dump's; the compact dump needs another --target_dir")
meta = {"samples": k, "compact_of": "eval.safetensors", "target_dir": target}
ac.write_safetensors(folder + "/eval.compact.safetensors", compact, {"meta": json.dumps(meta)})
PY
}

# run KIND TEACHER_FLAGS... -- STUDENT_FLAGS...
run() {
  local kind=$1
  shift
  local dir=$OUT/$kind
  rm -rf "$dir"
  mkdir -p "$dir"
  local tflags=() sflags=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do tflags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  sflags=("$@")
  "$TEACHER" --model_dir="$SRC/examples/tiny-code-llama" --data="$SRC/examples/data/train_conversations.jsonl" \
    --listen=127.0.0.1:0 --port_file="$dir/port" --metrics_port=-1 --threads=1 \
    --max_samples="$SAMPLES" --max_seq_len=256 --tokens_per_batch=512 --draft_vocab_size=512 \
    --ledger="$dir/ledger.jsonl" --exit_when_done \
    --eval_prompts="$SRC/examples/data/eval_prompts.jsonl" --eval_samples=4 --eval_max_new_tokens=32 \
    "${tflags[@]}" >"$dir/teacher.log" 2>&1 &
  teacher_pid=$!
  for _ in $(seq 600); do
    [ -s "$dir/port" ] && break
    kill -0 "$teacher_pid" 2>/dev/null || { cat "$dir/teacher.log" >&2; exit 1; }
    sleep 0.2
  done
  [ -s "$dir/port" ] || { echo "$kind: the teacher wrote no port" >&2; cat "$dir/teacher.log" >&2; exit 1; }
  local port
  port=$(head -n 1 "$dir/port" | tr -d '[:space:]')
  if ! "$STUDENT" --teacher="127.0.0.1:$port" --lr=2e-3 --warmup_steps=2 --metrics_port=-1 --threads=1 \
    --checkpoint_dir="$dir/ckpt" --checkpoint_every=10 --output_dir="$dir/export" \
    --summary_json="$dir/summary.json" --log_every=5 \
    --eval_dump="$dir/eval.safetensors" --export_dtype="$EXPORT_DTYPE" "${sflags[@]}" >"$dir/student.log" 2>&1; then
    echo "$kind: the student failed:" >&2
    tail -n 30 "$dir/student.log" >&2
    exit 1
  fi
  # The teacher exits once every sample is committed; give it a moment.
  for _ in $(seq 150); do kill -0 "$teacher_pid" 2>/dev/null || break; sleep 0.2; done
  cleanup
  wait "$teacher_pid" 2>/dev/null || true
  teacher_pid=
  for f in export/config.json export/model.safetensors eval.safetensors; do
    [ -s "$dir/$f" ] || { echo "$kind: $dir/$f was not written" >&2; exit 1; }
  done
  rm -rf "$dir/ckpt"
  write_compact "$dir"
  echo "$kind: $dir/export, $dir/eval.safetensors, $dir/eval.compact.safetensors (--target_dir=examples/tiny-code-llama)"
}

run dflash --draft_algorithm=dflash --dflash_layers=2 -- \
  --draft_algorithm=dflash --dflash_layers=2 --dflash_block_size=4 --dflash_num_anchors=64
run eagle31 --draft_algorithm=eagle3.1 -- --draft_algorithm=eagle3.1 --ttt_length=3

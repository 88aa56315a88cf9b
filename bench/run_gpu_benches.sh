#!/usr/bin/env bash
# The GPU issue's benchmarks, end to end, on nvidia-h200-x2 (two H200s):
#   1. teacher forward: the sgl and hf backends vs HF transformers
#      (Llama-3.2-1B / 3.1-8B shapes, 8x1024 and a ragged chat mix), MFU,
#      a speed ablation of the sgl techniques (1B), and the teacher-to-
#      student balance
#   2. hidden-state transfer per transport vs c10d ProcessGroupNCCL
#   3. student training step (fast and reference paths) vs a PyTorch eager
#      EAGLE-3 step; student_long: the 8B step at 2k-32k tokens
#   student_skip: chat-masked batches, untrained rows skipped or not
#   specforge: SpecForge HEAD's own step (its package under .baseline/)
#      against our fast step, 8B shape, 2k and 16k tokens
#   dflash: SpecForge HEAD's own DFlash step against ours, Qwen3-8B shape,
#      4k and 16k tokens ($DFLASH_TOKENS)
#   4. end to end on the 1B shape: teacher GPU 0 -> student GPU 1
#   tp:  teacher forward on the 8B shape, TP=2 over both GPUs vs TP=1
#   ddp: student step on the 8B shape, DDP=2 over both GPUs vs DDP=1
#   consistency: sgl vs hf per aux layer (bf16), against bf16's own gap
#   alternate: sgl vs HF transformers on 8x1024, alternated process by
#      process for $ROUNDS rounds (default 3; shapes $TEACHER_SHAPES,
#      default llama-8b), with the median ratio
#   moe_archs: DeepSeek and GPT-OSS reduced-depth shapes, sgl and hf vs
#      HF transformers on the same weights ($MOE_ARCH_SHAPES)
# Each prints the ratio against its baseline measured in this run; every
# JSON line also goes to $RESULTS (default bench-results.jsonl, under $OUT
# where that is set: the device machine's folder that comes back, since its
# copy of the working tree is replaced at the next call).
#
#   bench/run_gpu_benches.sh BUILD_DIR [teacher|transport|student|specforge|dflash|e2e|tp|ddp|consistency|moe_archs ...]
set -euo pipefail
BUILD=${1:?build dir}; shift
PARTS=${*:-teacher transport student e2e}
SRC=$(cd "$(dirname "$0")/.." && pwd)
RESULTS=${RESULTS:-${OUT:+$OUT/}bench-results.jsonl}
MODELS=${MODELS:-/tmp/e3-bench-models}
mkdir -p "$MODELS"
json() { grep '^{' | tee -a "$RESULTS"; }
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
# Writes the random-weight model of a shape under $MODELS once (the
# baseline script's own measurement is discarded).
ensure_model() {
  [ -f "$MODELS/$1/config.json" ] || python3 "$SRC/bench/hf_teacher_baseline.py" --shape=$1 --save_dir="$MODELS/$1" >/dev/null
}
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1])/float(sys.argv[2]):.2f}')" "$1" "$2"; }

# A ragged batch of chat samples, 200..2048 tokens (7770 tokens; padded
# to 8 x 2048 by transformers).
CHAT_MIX=200/2048/512/1400/320/900/1750/640

teacher() {
  for shape in ${TEACHER_SHAPES:-llama-1b llama-8b}; do
    local save=()
    [ -f "$MODELS/$shape/config.json" ] || save=(--save_dir="$MODELS/$shape")
    hf_dense=$(python3 "$SRC/bench/hf_teacher_baseline.py" --shape=$shape "${save[@]}" | json)
    hf_ragged=$(python3 "$SRC/bench/hf_teacher_baseline.py" --shape=$shape --lengths=$CHAT_MIX | json)
    # The served forward: aux states, last hidden and the lm_head argmax.
    # 1B also times each sgl technique switched off (the speed ablation).
    # (Not sgl-no-argmax-gemm: the FP8 argmax runs first on an H200, so that
    # variant would time sgl itself.)
    local backends=sgl,hf
    [ $shape = llama-8b ] && backends=sgl,hf,sgl-no-lt,sgl-no-fp8-argmax
    [ $shape = llama-1b ] && backends=sgl,hf,sgl-no-kernels,sgl-no-varlen,sgl-no-fusion,sgl-no-lt,sgl-no-residual-gemm,sgl-no-fp8-argmax,sgl-no-graphs
    ours=$("$BUILD/bench/teacher_forward_bench" --model_dir="$MODELS/$shape" --device=cuda:0 --dtype=bfloat16 \
      --shapes=8x1024,$CHAT_MIX --repeats=5 --logits --backends=$backends | tee /dev/stderr | json)
    student=$("$BUILD/bench/student_step_bench" --shape=$shape --device=cuda:0 | json)
    python3 - "$shape" "$hf_dense" "$hf_ragged" "$ours" "$student" <<'PY' | json_or_print
import json, sys
shape, hf_dense, hf_ragged = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
ours = [json.loads(l) for l in sys.argv[4].splitlines()]
student = json.loads(sys.argv[5])
for label, hf in (("8x1024", hf_dense), ("chat mix 200..2048", hf_ragged)):
    rows = {r["backend"]: r for r in ours if r["tokens"] == hf["tokens"]}
    sgl, ref = rows["sgl"], rows["hf"]
    r = sgl["tok_per_s"] / hf["tok_per_s_logits"]
    print(f"teacher {shape} {label} ({hf['tokens']} tokens, bf16, with lm_head): sgl {sgl['tok_per_s']:.0f} tok/s"
          f" (MFU {100*sgl['mfu']:.1f}%, host {100*sgl['host_issue_share']:.0f}% of wall), our hf"
          f" {ref['tok_per_s']:.0f} (MFU {100*ref['mfu']:.1f}%), HF transformers {hf['tok_per_s_logits']:.0f}:"
          f" sgl/transformers {r:.2f}, sgl/hf {sgl['tok_per_s']/ref['tok_per_s']:.2f}")
    for name, row in rows.items():
        if name.startswith("sgl-no-"):
            print(f"  ablation {name}: {row['tok_per_s']:.0f} tok/s ({row['tok_per_s']/sgl['tok_per_s']:.2f} of sgl)")
    print(json.dumps({"bench": "teacher_vs_transformers", "shape": shape, "batch": hf["batch"],
                      "tokens": hf["tokens"], "tok_per_s": sgl["tok_per_s"], "mfu": sgl["mfu"],
                      "baseline": "hf_transformers_logits", "baseline_tok_per_s": hf["tok_per_s_logits"],
                      "ratio": r, "hf_backend_tok_per_s": ref["tok_per_s"]}))
# Students one sgl teacher GPU keeps busy: its served rate over one student
# GPU's training rate on the same shape (student_step_bench, 2048 tokens).
sgl = next(r for r in ours if r["backend"] == "sgl" and r["tokens"] == hf_ragged["tokens"])
balance = sgl["tok_per_s"] / student["tok_per_s"]
print(f"balance {shape}: one sgl teacher GPU {sgl['tok_per_s']:.0f} tok/s (chat mix) feeds"
      f" {balance:.1f} student GPUs at {student['tok_per_s']:.0f} tok/s each")
print(json.dumps({"bench": "teacher_student_balance", "shape": shape, "teacher_tok_per_s": sgl["tok_per_s"],
                  "student_tok_per_s": student["tok_per_s"], "students_per_teacher_gpu": balance}))
PY
  done
}

transport() {
  "$BUILD/bench/transport_bench" --sizes_mib=64,256,1024 --iters=10 | tee >(json >/dev/null)
}

# The student step: our fast path and our reference path against the
# PyTorch eager statement of SpecForge v0.2's step (same GPU, same run),
# with SpecForge's fastest measured steps on an H200 as recorded anchors
# (8B 109.5 ms with plain bf16 AdamW, 1B 75.2 ms with its
# BF16Optimizer). Also 4 samples of 512 tokens and a chat-like batch
# (8 samples, the first 40% of each a prompt out of the loss).
student() {
  declare -A anchor=([llama-8b]=109.5 [llama-1b]=75.2)
  for shape in ${STUDENT_SHAPES:-llama-8b llama-1b}; do
    base=$(python3 "$SRC/bench/student_step_baseline.py" --shape=$shape | json)
    ref=$("$BUILD/bench/student_step_bench" --shape=$shape --device=cuda:0 --student_kernels=reference | tee /dev/stderr | json)
    fast=$("$BUILD/bench/student_step_bench" --shape=$shape --device=cuda:0 --student_kernels=fast | tee /dev/stderr | json)
    f=$(field "$fast" ms_per_step); r=$(field "$ref" ms_per_step); b=$(field "$base" ms_per_step)
    echo "student step $shape (2048 tokens, TTT 7, draft vocab 32000): fast $f ms (MFU $(field "$fast" mfu)," \
         "peak $(field "$fast" peak_gb) GB), reference $r ms, PyTorch eager $b ms: fast/eager $(ratio $b $f)," \
         "fast/reference $(ratio $r $f); vs SpecForge's ${anchor[$shape]} ms: $(ratio ${anchor[$shape]} $f)"
    for layout in "--samples=4 --tokens=2048" "--samples=8 --tokens=4096 --loss_mask=chat"; do
      f2=$("$BUILD/bench/student_step_bench" --shape=$shape --device=cuda:0 --student_kernels=fast $layout | json)
      r2=$("$BUILD/bench/student_step_bench" --shape=$shape --device=cuda:0 --student_kernels=reference $layout | json)
      echo "  $layout: fast $(field "$f2" ms_per_step) ms ($(field "$f2" tok_per_s) tok/s), reference" \
           "$(field "$r2" ms_per_step) ms: $(ratio $(field "$r2" ms_per_step) $(field "$f2" ms_per_step))x"
    done
  done
}

# Chat data (the first 40% of each sample a prompt, --loss_mask=chat): the
# fast step with rows no later TTT step trains left out of the midlayer
# from step 1 on, against the same step over every row, same run.
student_skip() {
  for layout in "--samples=8 --tokens=4096" "--samples=1 --tokens=16384"; do
    on=$("$BUILD/bench/student_step_bench" --shape=llama-8b --device=cuda:0 --student_kernels=fast --loss_mask=chat \
      $layout --warmup=2 --steps=5 --skip_untrained_rows=true | json)
    off=$("$BUILD/bench/student_step_bench" --shape=llama-8b --device=cuda:0 --student_kernels=fast --loss_mask=chat \
      $layout --warmup=2 --steps=5 --skip_untrained_rows=false | json)
    echo "student 8B chat $layout: skipping $(field "$on" ms_per_step) ms (midlayer rows" \
         "$(field "$on" midlayer_row_fraction) of all), every row $(field "$off" ms_per_step) ms:" \
         "$(ratio $(field "$off" ms_per_step) $(field "$on" ms_per_step))x"
  done
}

# Long sequences on the 8B shape (one sample, TTT 7): step time, peak
# memory and what the step adds per token, fast path only (the reference
# path's [heads, T, T] scores fill the GPU at 8k); from 4096 tokens with
# cuDNN's attention and with varlen flash's, in the same run.
student_long() {
  for tokens in ${LONG_TOKENS:-2048 4096 8192 16384 32768}; do
    out=$("$BUILD/bench/student_step_bench" --shape=llama-8b --device=cuda:0 --student_kernels=fast --tokens=$tokens \
      --warmup=2 --steps=3 | json)
    flash=$("$BUILD/bench/student_step_bench" --shape=llama-8b --device=cuda:0 --student_kernels=fast --tokens=$tokens \
      --warmup=2 --steps=3 --cudnn_attention=false | json)
    echo "student 8B, $tokens tokens in one sample: $(field "$out" ms_per_step) ms/step (varlen flash" \
         "$(field "$flash" ms_per_step): $(ratio $(field "$flash" ms_per_step) $(field "$out" ms_per_step))x)," \
         "$(field "$out" tok_per_s) tok/s, peak $(field "$out" peak_gb) GB, $(field "$out" step_kb_per_token) KB per token"
  done
}

# SpecForge HEAD's own EAGLE-3 step (bench/specforge_step.py, its package
# from .baseline/specforge or $SPECFORGE_DIR; flex attention, BF16Optimizer,
# the target's distribution from its last hidden state) against our fast
# step on the 8B shape, one sample of 2048 and of 16384 tokens, same run.
# SpecForge runs without its FSDP wrapper (its fastest on one GPU) with the
# full-vocab target head and with its compact teacher; the ratio is against
# the faster of the two.
specforge() {
  local dir=${SPECFORGE_DIR:-$SRC/.baseline/specforge} tokens=${SF_TOKENS:-2048 16384}
  [ -d "$dir/specforge" ] || { echo "no SpecForge package under $dir (see bench/specforge_step.py)"; return 1; }
  for t in $tokens; do
    ours=$("$BUILD/bench/student_step_bench" --shape=llama-8b --device=cuda:0 --student_kernels=fast --tokens=$t \
      --warmup=2 --steps=5 | json)
    best=""
    for teacher in head compact; do
      sf=$(PYTHONPATH="$dir" python3 "$SRC/bench/specforge_step.py" --tokens=$t --attention=flex --wrap=none \
        --harness=core --teacher=$teacher 2>"${OUT:-/tmp}/specforge_${teacher}_$t.log" | grep '^{"bench": "specforge_step"' | tee -a "$RESULTS" || true)
      if [ -z "$sf" ] || ! ms=$(field "$sf" ms_per_step 2>/dev/null); then
        echo "SpecForge ($teacher teacher, $t tokens) gave no timing; see ${OUT:-/tmp}/specforge_${teacher}_$t.log"
        continue
      fi
      echo "SpecForge HEAD 8B, $t tokens, $teacher teacher: $ms ms/step, peak $(field "$sf" peak_gb) GB"
      if [ -z "$best" ] || python3 -c "import sys; sys.exit(not float(sys.argv[1]) < float(sys.argv[2]))" "$ms" "$best"; then best=$ms; fi
    done
    echo "student 8B, $t tokens: ours $(field "$ours" ms_per_step) ms/step (peak $(field "$ours" peak_gb) GB);" \
         "SpecForge's fastest ${best:-n/a} ms: $( [ -n "$best" ] && ratio $best $(field "$ours" ms_per_step) )x"
  done
}

# SpecForge HEAD's own DFlash step (bench/specforge_dflash_step.py: its
# DFlashDraftModel in OnlineDFlashModel, flex attention, BF16Optimizer, no
# FSDP wrap) against our DFlash step (bench/dflash_step_bench), Qwen3-8B
# shape (5 draft layers, blocks of 16, 512 anchors), one sample of each of
# $DFLASH_TOKENS tokens, same run.
dflash() {
  local dir=${SPECFORGE_DIR:-$SRC/.baseline/specforge}
  [ -d "$dir/specforge" ] || { echo "no SpecForge package under $dir (see bench/specforge_dflash_step.py)"; return 1; }
  for t in ${DFLASH_TOKENS:-4096 16384}; do
    ours=$("$BUILD/bench/dflash_step_bench" --shape=qwen3-8b --device=cuda:0 --tokens=$t --warmup=2 --steps=5 | json)
    sf=$(PYTHONPATH="$dir" python3 "$SRC/bench/specforge_dflash_step.py" --tokens=$t --wrap=none --steps=5 \
      2>"${OUT:-/tmp}/specforge_dflash_$t.log" | grep '^{"bench": "specforge_dflash_step"' | tee -a "$RESULTS" || true)
    if [ -z "$sf" ] || ! ms=$(field "$sf" ms_per_step 2>/dev/null); then
      echo "SpecForge DFlash ($t tokens) gave no timing; see ${OUT:-/tmp}/specforge_dflash_$t.log"
      ms=""
    fi
    echo "DFlash step, Qwen3-8B shape, $t tokens: ours $(field "$ours" ms_per_step) ms/step" \
         "(peak $(field "$ours" peak_gb) GB); SpecForge HEAD ${ms:-n/a} ms (peak $( [ -n "$ms" ] && field "$sf" peak_gb ) GB):" \
         "$( [ -n "$ms" ] && ratio $ms $(field "$ours" ms_per_step) )x"
  done
}

e2e() {
  local dir="$MODELS/llama-1b"
  ensure_model llama-1b
  # The bundled tokenizer and template: its ids all lie inside the 1B vocab.
  cp "$SRC/examples/tiny-code-llama/"{tokenizer.json,tokenizer_config.json,chat_template.jinja} "$dir/"
  local run=${LOGS:-$(mktemp -d)}
  mkdir -p "$run"
  "$BUILD/teacher_server/teacher_server" --model_dir="$dir" --data="$SRC/examples/data/train_conversations.jsonl" \
    --device=cuda:0 --tokens_per_batch=2048 --max_seq_len=2048 --draft_vocab_size=32000 --listen=127.0.0.1:0 \
    --port_file="$run/port" --metrics_port=-1 > "$run/teacher.log" 2>&1 &
  local tpid=$!
  for _ in $(seq 600); do [ -s "$run/port" ] && break; sleep 0.2; done
  if [ ! -s "$run/port" ]; then echo "teacher did not start:"; tail -20 "$run/teacher.log"; kill $tpid; return 1; fi
  if ! "$BUILD/student_trainer/student_trainer" --teacher=127.0.0.1:$(head -1 "$run/port") --device=cuda:1 \
    --max_steps=150 --log_every=25 --metrics_port=-1 --summary_json="$run/summary.json" > "$run/student.log" 2>&1; then
    echo "student failed:"; tail -20 "$run/student.log"; tail -5 "$run/teacher.log"; kill $tpid; return 1
  fi
  kill $tpid; wait $tpid || true
  tail -4 "$run/student.log"
  iso=$("$BUILD/bench/student_step_bench" --shape=llama-1b --device=cuda:1 --tokens=2048 --samples=4 | json)
  python3 - "$run/summary.json" "$(field "$iso" tok_per_s)" <<'PY' | json_or_print
import json, sys
s = json.load(open(sys.argv[1]))
iso = float(sys.argv[2])
print(f"e2e 1B shape, teacher cuda:0 -> student cuda:1 over {s['transport']}: {s['tokens_per_second']:.0f} trained tok/s,"
      f" data wait {100*s['data_wait_share']:.1f}% of the student's time; isolated student step {iso:.0f} tok/s:"
      f" ratio {s['tokens_per_second']/iso:.2f}")
print(json.dumps({"bench": "e2e_1b", "transport": s["transport"], "trained_tok_per_s": s["tokens_per_second"],
                  "data_wait_share": s["data_wait_share"], "steps": s["steps"],
                  "baseline": "isolated_student_step", "baseline_tok_per_s": iso,
                  "ratio": s["tokens_per_second"] / iso}))
PY
}
tp() {
  local dir="$MODELS/llama-8b"
  [ -f "$dir/config.json" ] || python3 "$SRC/bench/hf_teacher_baseline.py" --shape=llama-8b --save_dir="$dir" | json >/dev/null
  # One backend per process group (a sharded run times only the first):
  # TP_BACKENDS lists them (e.g. "sgl sgl-no-fp8-argmax hf"), TP_LOGITS
  # whether the lm_head argmax is computed ("false true" by default).
  for backend in ${TP_BACKENDS:-sgl}; do
    local args=(--model_dir="$dir" --device=cuda --dtype=bfloat16 --shapes=8x1024,ragged,$CHAT_MIX --repeats=5
                --backends=$backend)
    for logits in ${TP_LOGITS:-false true}; do
      one=$("$BUILD/bench/teacher_forward_bench" "${args[@]}" --logits=$logits | json)
      "$BUILD/bench/teacher_forward_bench" "${args[@]}" --logits=$logits --tp_size=2 --tp_rank=1 > /tmp/tp_rank1.log 2>&1 &
      two=$("$BUILD/bench/teacher_forward_bench" "${args[@]}" --logits=$logits --tp_size=2 --tp_rank=0 | json)
      wait $! || { echo "rank 1 failed:"; tail -5 /tmp/tp_rank1.log; }
      python3 - "$one" "$two" <<'PY' | json_or_print
import json, sys
one = {r["shape"]: r for r in map(json.loads, sys.argv[1].splitlines())}
two = [json.loads(l) for l in sys.argv[2].splitlines()]
for b in two:
    a = one[b["shape"]]
    r = b["tok_per_s"] / a["tok_per_s"]
    print(f"teacher 8B {a['backend']} {a['shape']} lm_head={a['lm_head']}: TP=2 {b['tok_per_s']:.0f} tok/s vs TP=1 {a['tok_per_s']:.0f}:"
          f" ratio {r:.2f} (scaling efficiency {r/2:.2f})")
    print(json.dumps({"bench": "teacher_tp", "backend": a["backend"], "shape": a["shape"], "lm_head": a["lm_head"], "tp_size": 2,
                      "tok_per_s": b["tok_per_s"], "baseline": "tp1_same_model", "baseline_tok_per_s": a["tok_per_s"],
                      "ratio": r}))
PY
    done
  done
}

ddp() {
  one=$("$BUILD/bench/student_step_bench" --shape=llama-8b --device=cuda:0 | json)
  "$BUILD/bench/student_step_bench" --shape=llama-8b --world_size=2 --rank=1 > /tmp/ddp_rank1.log 2>&1 &
  two=$("$BUILD/bench/student_step_bench" --shape=llama-8b --world_size=2 --rank=0 | json)
  wait $! || { echo "rank 1 failed:"; tail -5 /tmp/ddp_rank1.log; }
  python3 - "$one" "$two" <<'PY' | json_or_print
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
r = b["tok_per_s"] / a["tok_per_s"]
print(f"student step 8B: DDP=2 {b['tok_per_s']:.0f} tok/s ({b['ms_per_step']:.1f} ms/step) vs DDP=1 {a['tok_per_s']:.0f}"
      f" ({a['ms_per_step']:.1f} ms/step): ratio {r:.2f} (scaling efficiency {r/2:.2f})")
print(json.dumps({"bench": "student_ddp", "shape": "llama-8b", "world_size": 2, "tok_per_s": b["tok_per_s"],
                  "ms_per_step": b["ms_per_step"], "baseline": "ddp1", "baseline_tok_per_s": a["tok_per_s"],
                  "ratio": r}))
PY
}

consistency() {
  local dir="$MODELS/llama-1b"
  ensure_model llama-1b
  # tiny-code-llama also with each sgl technique off: which one moves the
  # outputs (the per-layer ablation).
  for fast in sgl sgl-no-fusion sgl-no-varlen sgl-no-kernels sgl-no-residual-gemm; do
    "$BUILD/bench/backend_consistency_bench" --model_dir="$SRC/examples/tiny-code-llama" --device=cuda:0 \
      --dtype=bfloat16 --sgl=$fast | json_or_print || echo "($fast: FAIL, exit status above)"
  done
  "$BUILD/bench/backend_consistency_bench" --model_dir="$dir" --device=cuda:0 --dtype=bfloat16 | json_or_print \
    || echo "(1B: FAIL)"
}

# On a power-capped board both forwards drift with the clock, and machines
# of one kind differ by a few percent: alternating the two processes puts
# the drift on both. The first sgl run tunes the GEMMs into a cache that
# the timed runs read, so no tuning heats the GPU just before a measured
# forward.
alternate() {
  for shape in ${TEACHER_SHAPES:-llama-8b}; do
    local dir="$MODELS/$shape" cache="$MODELS/gemm_tuning.json" ratios=""
    ensure_model "$shape"
    "$BUILD/bench/teacher_forward_bench" --model_dir="$dir" --device=cuda:0 --dtype=bfloat16 --logits \
      --shapes=8x1024 --repeats=1 --backends=sgl --gemm_tuning_cache="$cache" | grep -E "coordinate|check at|GEMM alg"
    for round in $(seq "${ROUNDS:-3}"); do
      hf=$(python3 "$SRC/bench/hf_teacher_baseline.py" --shape=$shape | json)
      ours=$("$BUILD/bench/teacher_forward_bench" --model_dir="$dir" --device=cuda:0 --dtype=bfloat16 --logits \
        --shapes=8x1024 --repeats=5 --backends=sgl --gemm_tuning_cache="$cache" | json)
      r=$(python3 -c "import json,sys; print(f'{json.loads(sys.argv[2])[\"tok_per_s\"] / json.loads(sys.argv[1])[\"tok_per_s_logits\"]:.3f}')" "$hf" "$ours")
      printf 'alternate %s round %d: transformers %.0f tok/s, sgl %.0f tok/s: %s\n' "$shape" "$round" \
        "$(field "$hf" tok_per_s_logits)" "$(field "$ours" tok_per_s)" "$r"
      ratios="$ratios $r"
    done
    python3 - "$shape" $ratios <<'PY' | json_or_print
import json, statistics, sys
shape, ratios = sys.argv[1], [float(r) for r in sys.argv[2:]]
print(f"alternate {shape} 8x1024: sgl / transformers {min(ratios):.3f}-{max(ratios):.3f},"
      f" median {statistics.median(ratios):.3f} over {len(ratios)} rounds")
print(json.dumps({"bench": "teacher_vs_transformers_alternated", "shape": shape, "tokens": 8192,
                  "baseline": "hf_transformers_logits", "ratios": ratios, "median": statistics.median(ratios)}))
PY
  done
}

# End to end on one GPU: the sgl teacher and the student share it on
# $E2E_SHAPE (default llama-8b, random weights), 2048-token batches, the
# draft $E2E_ALGORITHM (default eagle3; dflash: 512 blocks of 16 per
# batch); the student's trained tokens per second and its data wait.
e2e_one_gpu() {
  local shape=${E2E_SHAPE:-llama-8b} dir="$MODELS/${E2E_SHAPE:-llama-8b}"
  local algorithm=--draft_algorithm=${E2E_ALGORITHM:-eagle3}
  ensure_model $shape
  cp "$SRC/examples/tiny-code-llama/"{tokenizer.json,tokenizer_config.json,chat_template.jinja} "$dir/"
  local run=${LOGS:-$(mktemp -d)}
  mkdir -p "$run"
  "$BUILD/teacher_server/teacher_server" --model_dir="$dir" --data="$SRC/examples/data/train_conversations.jsonl" \
    --device=cuda:0 --tokens_per_batch=2048 --max_seq_len=2048 --draft_vocab_size=32000 --listen=127.0.0.1:0 \
    --gemm_tuning=false --port_file="$run/port" --metrics_port=-1 $algorithm > "$run/teacher.log" 2>&1 &
  local tpid=$!
  for _ in $(seq 1500); do [ -s "$run/port" ] && break; sleep 0.2; done
  if [ ! -s "$run/port" ]; then echo "teacher did not start:"; tail -20 "$run/teacher.log"; kill $tpid; return 1; fi
  if ! "$BUILD/student_trainer/student_trainer" --teacher=127.0.0.1:$(head -1 "$run/port") --device=cuda:0 \
    --max_steps=${E2E_STEPS:-120} --log_every=20 --metrics_port=-1 --summary_json="$run/summary.json" \
    --step_log="$run/steps.jsonl" $algorithm > "$run/student.log" 2>&1; then
    echo "student failed:"; tail -20 "$run/student.log"; tail -5 "$run/teacher.log"; kill $tpid; return 1
  fi
  kill $tpid; wait $tpid || true
  tail -3 "$run/student.log"
  python3 - "$run/summary.json" "$run/steps.jsonl" "$shape" "${E2E_ALGORITHM:-eagle3}" <<'PY' | json_or_print
import json, sys
s = json.load(open(sys.argv[1]))
steps = [json.loads(l) for l in open(sys.argv[2]) if l.strip()][20:]  # steady state: past the first 20 steps
tok = sum(x["tokens"] for x in steps)
sec = sum(x["seconds"] for x in steps)
wait = sum(x.get("data_wait_seconds", 0) for x in steps)
print(f"e2e {sys.argv[3]} {sys.argv[4]} on one GPU (sgl teacher + fast student, {s['transport']}): {s['tokens_per_second']:.0f} trained"
      f" tok/s over the run, {tok/sec:.0f} in steady state (steps 21-{s['steps']}); data wait {100*wait/sec:.1f}%")
print(json.dumps({"bench": "e2e_one_gpu", "shape": sys.argv[3], "algorithm": sys.argv[4], "transport": s["transport"],
                  "trained_tok_per_s": s["tokens_per_second"], "steady_tok_per_s": tok / sec,
                  "steady_data_wait_share": wait / sec, "steps": s["steps"]}))
PY
}

json_or_print() { while IFS= read -r l; do case "$l" in '{'*) echo "$l" >> "$RESULTS";; esac; echo "$l"; done; }

# DeepSeek and GPT-OSS teachers at reduced depth (hf_teacher_baseline.py's
# shapes; $MOE_ARCH_SHAPES, default V2-Lite 8 layers and GPT-OSS-20B 6
# layers; deepseek-v3-2l writes 28 GB): transformers (its own experts path;
# sdpa, or eager for GPT-OSS's sinks) against our backends
# ($MOE_ARCH_BACKENDS, default sgl,hf) on the same weights, 8x1024, with
# the lm_head.
moe_archs() {
  for shape in ${MOE_ARCH_SHAPES:-deepseek-v2-lite-8l gpt-oss-20b-6l}; do
    local save=()
    [ -f "$MODELS/$shape/config.json" ] || save=(--save_dir="$MODELS/$shape")
    hf=$(python3 "$SRC/bench/hf_teacher_baseline.py" --shape=$shape "${save[@]}" | json)
    ours=$("$BUILD/bench/teacher_forward_bench" --model_dir="$MODELS/$shape" --device=cuda:0 --dtype=bfloat16 \
      --shapes=8x1024 --repeats=5 --logits --backends=${MOE_ARCH_BACKENDS:-sgl,hf} | tee /dev/stderr | json)
    python3 - "$shape" "$hf" "$ours" <<'PY' | json_or_print
import json, sys
shape, hf = sys.argv[1], json.loads(sys.argv[2])
rows = {r["backend"]: r for r in (json.loads(l) for l in sys.argv[3].splitlines())}
base = hf["tok_per_s_logits"]
parts = ", ".join(f"{name} {r['tok_per_s']:.0f} ({r['tok_per_s'] / base:.2f}x, host {100 * r['host_issue_share']:.0f}%)"
                  for name, r in rows.items())
print(f"teacher {shape} 8x1024 (bf16, with lm_head): transformers {base:.0f} tok/s"
      f" (experts {hf.get('experts_implementation')}); ours: {parts}")
for name, r in rows.items():
    print(json.dumps({"bench": "teacher_vs_transformers", "shape": shape, "batch": hf["batch"],
                      "tokens": hf["tokens"], "backend": name, "tok_per_s": r["tok_per_s"],
                      "baseline": "hf_transformers_logits", "baseline_tok_per_s": base,
                      "ratio": r["tok_per_s"] / base}))
PY
  done
}

for p in $PARTS; do echo "== $p"; $p; done

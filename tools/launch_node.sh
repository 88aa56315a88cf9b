#!/usr/bin/env bash
# One node, one command, the seed's layout: teachers on one device list,
# data-parallel students on another.
#
#   tools/launch_node.sh --teacher_devices 0,1,2,3 --teacher_tp 4 --student_devices 4,5,6,7 \
#       --model_dir /models/Llama-3.1-8B-Instruct --data train.jsonl --out run1 \
#       [--teacher_ep 2] [--teacher_args "--tokens_per_batch=8192"] [--student_args "--max_steps=1000"]
#
# Devices are GPU indices, or `cpu`. The teacher devices are cut into
# groups of --teacher_tp (default 1) consecutive devices; each group is one
# teacher: a model sharded with tensor parallelism over its devices (one
# teacher_server process per device, rank 0 serving gRPC; --teacher_ep
# splits a MoE model's experts into that many groups), serving one shard of
# the data (--num_data_shards = number of groups). So `0,1,2,3 --teacher_tp
# 4` is one TP=4 teacher and `0,1,2,3 --teacher_tp 2` two TP=2 teachers,
# each with half the data. Each student device runs one
# student_trainer rank (RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR /
# MASTER_PORT as torchrun sets them) subscribed to every teacher. Rank 0
# checkpoints to OUT/checkpoints and exports OUT/draft. Logs and summaries
# land in OUT. The command returns when the students are done (non-zero if
# any failed); the teachers then exit when every rank has committed.
set -euo pipefail
BUILD=${BUILD:-build}
TEACHER_DEVICES="" STUDENT_DEVICES="" MODEL="" DATA="" OUT="run" TARGS="" SARGS="" MASTER_PORT=${MASTER_PORT:-29500}
TP=1 EP=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --teacher_devices) TEACHER_DEVICES=$2; shift 2 ;;
    --student_devices) STUDENT_DEVICES=$2; shift 2 ;;
    --model_dir) MODEL=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --teacher_tp) TP=$2; shift 2 ;;
    --teacher_ep) EP=$2; shift 2 ;;
    --teacher_args) TARGS=$2; shift 2 ;;
    --student_args) SARGS=$2; shift 2 ;;
    --master_port) MASTER_PORT=$2; shift 2 ;;
    --build_dir) BUILD=$2; shift 2 ;;
    *) echo "launch_node: unknown argument $1" >&2; exit 2 ;;
  esac
done
for v in TEACHER_DEVICES STUDENT_DEVICES MODEL DATA; do
  [[ -n "${!v}" ]] || { echo "launch_node: --$(echo $v | tr 'A-Z' 'a-z') is required" >&2; exit 2; }
done
device() { [[ "$1" == cpu ]] && echo cpu || echo "cuda:$1"; }
IFS=, read -ra TDEV <<< "$TEACHER_DEVICES"
IFS=, read -ra SDEV <<< "$STUDENT_DEVICES"
(( ${#TDEV[@]} % TP == 0 )) || { echo "launch_node: --teacher_tp $TP does not divide the ${#TDEV[@]} teacher devices" >&2; exit 2; }
NT=$(( ${#TDEV[@]} / TP ))
mkdir -p "$OUT"
PIDS=() TPIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

for ((i = 0; i < NT; i++)); do
  for ((r = TP - 1; r >= 0; r--)); do  # rank 0 last: the group's store waits for it
    dev=${TDEV[$(( i * TP + r ))]}
    tp_args=()
    (( TP > 1 )) && tp_args=(--tp_size="$TP" --ep_size="$EP" --tp_rank="$r" --tp_master_addr=127.0.0.1
                             --tp_master_port=$(( MASTER_PORT + 1 + i )))
    log="$OUT/teacher-$i.log"; (( r > 0 )) && log="$OUT/teacher-$i-rank$r.log"
    # shellcheck disable=SC2086
    "$BUILD/teacher_server/teacher_server" --model_dir="$MODEL" --data="$DATA" --device="$(device "$dev")" \
      --num_data_shards=$NT --data_shard="$i" --listen=0.0.0.0:0 --port_file="$OUT/teacher-$i.port" \
      --ledger="$OUT/ledger-$i.jsonl" --exit_when_done "${tp_args[@]}" $TARGS >"$log" 2>&1 &
    PIDS+=($!)
    TPIDS+=($!)
  done
done
ADDRS=()
for ((i = 0; i < NT; i++)); do
  for _ in $(seq 3000); do [[ -s "$OUT/teacher-$i.port" ]] && break; sleep 0.1; done
  [[ -s "$OUT/teacher-$i.port" ]] || { echo "launch_node: teacher $i did not start:"; tail -20 "$OUT/teacher-$i"*.log; exit 1; }
  ADDRS+=("127.0.0.1:$(head -1 "$OUT/teacher-$i.port")")
done
TEACHERS=$(IFS=,; echo "${ADDRS[*]}")
echo "launch_node: $NT teacher(s) of TP=$TP at $TEACHERS; ${#SDEV[@]} student rank(s)"

SPIDS=()
for r in "${!SDEV[@]}"; do
  # shellcheck disable=SC2086
  RANK=$r WORLD_SIZE=${#SDEV[@]} LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$MASTER_PORT \
    "$BUILD/student_trainer/student_trainer" --teacher="$TEACHERS" --device="$(device "${SDEV[$r]}")" \
    --checkpoint_dir="$OUT/checkpoints" --output_dir="$OUT/draft" --summary_json="$OUT/summary-$r.json" \
    --metrics_port=0 $SARGS >"$OUT/student-$r.log" 2>&1 &
  SPIDS+=($!)
  PIDS+=($!)
done
status=0
for r in "${!SPIDS[@]}"; do
  if ! wait "${SPIDS[$r]}"; then
    echo "launch_node: student rank $r failed:"; tail -20 "$OUT/student-$r.log"; status=1
  fi
done
grep -h "=== student\|  first\|  last\|exported" "$OUT"/student-*.log || true
if [[ $status -ne 0 ]]; then exit $status; fi
# Teachers exit once every rank has committed all their data; students
# stopped early (--max_steps) leave them serving, so give them a minute.
for _ in $(seq 600); do
  alive=0
  for p in "${TPIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  [[ $alive -eq 0 ]] && break
  sleep 0.1
done
for p in "${TPIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
trap - EXIT
echo "launch_node: done; logs, summaries and the draft are in $OUT"

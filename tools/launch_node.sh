#!/usr/bin/env bash
# One node, one command, the seed's layout: teachers on one device list,
# data-parallel students on another.
#
#   tools/launch_node.sh --teacher_devices 0,1 --student_devices 2,3 \
#       --model_dir /models/Llama-3.1-8B-Instruct --data train.jsonl --out run1 \
#       [--teacher_args "--tokens_per_batch=8192"] [--student_args "--max_steps=1000"]
#
# Devices are GPU indices, or `cpu`. Each teacher device runs one
# teacher_server serving one shard of the data (--num_data_shards); until
# teacher tensor parallelism lands, a device list means data-parallel
# teachers, not one sharded model. Each student device runs one
# student_trainer rank (RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR /
# MASTER_PORT as torchrun sets them) subscribed to every teacher. Rank 0
# checkpoints to OUT/checkpoints and exports OUT/draft. Logs and summaries
# land in OUT. The command returns when the students are done (non-zero if
# any failed); the teachers then exit when every rank has committed.
set -euo pipefail
BUILD=${BUILD:-build}
TEACHER_DEVICES="" STUDENT_DEVICES="" MODEL="" DATA="" OUT="run" TARGS="" SARGS="" MASTER_PORT=${MASTER_PORT:-29500}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --teacher_devices) TEACHER_DEVICES=$2; shift 2 ;;
    --student_devices) STUDENT_DEVICES=$2; shift 2 ;;
    --model_dir) MODEL=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
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
mkdir -p "$OUT"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

for i in "${!TDEV[@]}"; do
  # shellcheck disable=SC2086
  "$BUILD/teacher_server/teacher_server" --model_dir="$MODEL" --data="$DATA" --device="$(device "${TDEV[$i]}")" \
    --num_data_shards=${#TDEV[@]} --data_shard="$i" --listen=0.0.0.0:0 --port_file="$OUT/teacher-$i.port" \
    --ledger="$OUT/ledger-$i.jsonl" --exit_when_done $TARGS >"$OUT/teacher-$i.log" 2>&1 &
  PIDS+=($!)
done
ADDRS=()
for i in "${!TDEV[@]}"; do
  for _ in $(seq 3000); do [[ -s "$OUT/teacher-$i.port" ]] && break; sleep 0.1; done
  [[ -s "$OUT/teacher-$i.port" ]] || { echo "launch_node: teacher $i did not start:"; tail -20 "$OUT/teacher-$i.log"; exit 1; }
  ADDRS+=("127.0.0.1:$(head -1 "$OUT/teacher-$i.port")")
done
TEACHERS=$(IFS=,; echo "${ADDRS[*]}")
echo "launch_node: ${#TDEV[@]} teacher(s) at $TEACHERS; ${#SDEV[@]} student rank(s)"

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
  for i in "${!TDEV[@]}"; do kill -0 "${PIDS[$i]}" 2>/dev/null && alive=1; done
  [[ $alive -eq 0 ]] && break
  sleep 0.1
done
for i in "${!TDEV[@]}"; do kill -TERM "${PIDS[$i]}" 2>/dev/null || true; wait "${PIDS[$i]}" 2>/dev/null || true; done
trap - EXIT
echo "launch_node: done; logs, summaries and the draft are in $OUT"

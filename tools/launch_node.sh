#!/usr/bin/env bash
# One node, one command: the launcher (build/launcher/e3_launch) with the
# seed's flags, or with a run config.
#
#   tools/launch_node.sh --config examples/configs/llama-3.1-8b-1node.yaml [section.key=value ...] [--plan]
#   tools/launch_node.sh --teacher_devices 0,1,2,3 --teacher_tp 4 --student_devices 4,5,6,7 \
#       --model_dir /models/Llama-3.1-8B-Instruct --data train.jsonl --out run1 \
#       [--teacher_ep 2] [--teacher_args "--tokens_per_batch=8192"] [--student_args "--max_steps=1000"]
#
# Each flag is a run-config key (docs in examples/configs/ and README "One
# node, one command"): --teacher_devices teachers.devices, --teacher_tp
# teachers.tp, --teacher_ep teachers.ep, --student_devices
# students.devices, --model_dir model.dir, --data data.train, --out
# run.out, --master_port run.master_port (unused: the c10d groups meet
# through files under run.out; kept so older command lines still run),
# --teacher_args teachers.args, --student_args students.args. Devices
# are GPU indices, or `cpu`. The teacher devices are cut into groups of
# teachers.tp consecutive devices; each group is one teacher (a model
# sharded with tensor parallelism over its devices, rank 0 serving gRPC)
# serving one shard of the data. Each
# student device runs one data-parallel student rank subscribed to every
# teacher. The launcher shows a status line per process, stops everything
# the moment a process fails (showing the end of its log), and returns
# when the students are done; logs, summaries, checkpoints, the draft and
# run.png land in the output directory.
set -euo pipefail
BUILD=${BUILD:-build}
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --config) ARGS+=("--config=$2"); shift 2 ;;
    --plan) ARGS+=(--plan); shift ;;
    --teacher_devices) ARGS+=("teachers.devices=$2"); shift 2 ;;
    --student_devices) ARGS+=("students.devices=$2"); shift 2 ;;
    --model_dir) ARGS+=("model.dir=$2"); shift 2 ;;
    --data) ARGS+=("data.train=$2"); shift 2 ;;
    --out) ARGS+=("run.out=$2"); shift 2 ;;
    --teacher_tp) ARGS+=("teachers.tp=$2"); shift 2 ;;
    --teacher_ep) ARGS+=("teachers.ep=$2"); shift 2 ;;
    --teacher_args) ARGS+=("teachers.args=$2"); shift 2 ;;
    --student_args) ARGS+=("students.args=$2"); shift 2 ;;
    --master_port) ARGS+=("run.master_port=$2"); shift 2 ;;
    --build_dir) BUILD=$2; shift 2 ;;
    *=*) ARGS+=("$1"); shift ;;
    *) echo "launch_node: unknown argument $1" >&2; exit 2 ;;
  esac
done
exec "$BUILD/launcher/e3_launch" --build_dir="$BUILD" "${ARGS[@]}"

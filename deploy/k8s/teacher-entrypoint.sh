#!/bin/bash
# A teacher pod of a LeaderWorkerSet group: one teacher_server per GPU of the
# pod. The group is one tensor-parallel teacher of TP = pods x GPUs per pod
# ranks; pod w (LWS_WORKER_INDEX, 0 = the leader) holds ranks
# w*G .. w*G+G-1. Rank 0 serves gRPC and /metrics; the others follow it over
# c10d at the leader's address. With the optional Secret e3-tls mounted at
# /etc/e3/tls, rank 0 serves TLS with its tls.crt/tls.key (the students
# authenticate with the token, not with certificates). If any rank exits, the pod exits with it, and
# the LeaderWorkerSet recreates the whole group (RecreateGroupOnPodRestart).
#
# Environment: LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX (set by
# the LeaderWorkerSet controller), E3_GPUS_PER_POD (the layout, equal to the
# pod's nvidia.com/gpu limit), E3_DATA_SHARD / E3_NUM_DATA_SHARDS (which
# slice of the data this teacher serves), E3_MASTER_PORT; the arguments are
# passed to every rank (model, data, run config, auth).
set -euo pipefail
: "${LWS_LEADER_ADDRESS:?set by the LeaderWorkerSet controller}"
: "${LWS_GROUP_SIZE:?set by the LeaderWorkerSet controller}"
: "${LWS_WORKER_INDEX:?set by the LeaderWorkerSet controller}"
: "${E3_GPUS_PER_POD:?the layout sets it with the pod GPU limit}"
G=$E3_GPUS_PER_POD
TP=$(( LWS_GROUP_SIZE * G ))
common=(--tp_size="$TP" --master_addr="$LWS_LEADER_ADDRESS" --master_port="${E3_MASTER_PORT:-29600}"
        --num_data_shards="${E3_NUM_DATA_SHARDS:-1}" --data_shard="${E3_DATA_SHARD:-0}")
tls=()
if [[ -s /etc/e3/tls/tls.crt && -s /etc/e3/tls/tls.key ]]; then
  tls=(--tls_cert=/etc/e3/tls/tls.crt --tls_key=/etc/e3/tls/tls.key)
fi
pids=()
for (( local = 0; local < G; ++local )); do
  rank=$(( LWS_WORKER_INDEX * G + local ))
  if (( rank == 0 )); then
    teacher_server "${common[@]}" --tp_rank=0 --device=cuda:$local \
      --listen=0.0.0.0:50051 --metrics_host=0.0.0.0 --metrics_port=9400 "${tls[@]}" "$@" &
  else
    teacher_server "${common[@]}" --tp_rank=$rank --device=cuda:$local "$@" &
  fi
  pids+=($!)
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM INT
# The first rank to exit ends the pod; its status is the pod's.
set +e
wait -n "${pids[@]}"
status=$?
kill -TERM "${pids[@]}" 2>/dev/null
wait
exit "$status"

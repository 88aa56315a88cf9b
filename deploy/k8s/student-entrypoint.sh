#!/bin/bash
# A student pod of the Indexed Job: its process rank is the completion index
# (never a node index); one GPU per pod, so LOCAL_RANK is 0. WORLD_SIZE,
# MASTER_ADDR and MASTER_PORT come from the Job's environment. With the
# optional Secret e3-tls mounted at /etc/e3/tls, the student checks the
# teacher's certificate against its ca.crt (the certificate must name
# e3-teacher-0.e3-teacher).
set -euo pipefail
: "${JOB_COMPLETION_INDEX:?set by the Indexed Job controller}"
export RANK=$JOB_COMPLETION_INDEX LOCAL_RANK=0
tls=()
if [[ -s /etc/e3/tls/ca.crt ]]; then
  tls=(--tls_ca=/etc/e3/tls/ca.crt)
fi
exec student_trainer --device=cuda:0 --metrics_host=0.0.0.0 --metrics_port=9500 "${tls[@]}" "$@"

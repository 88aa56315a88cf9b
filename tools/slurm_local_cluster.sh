#!/usr/bin/env bash
# A throwaway Slurm cluster on this machine, from Debian's slurm-wlm and
# munge: one slurmctld and two slurmd (two Slurm nodes on one host), all
# state, spool, sockets and logs under DIR, on free ports.
#
#   tools/slurm_local_cluster.sh start DIR [WATCH_PID]   # prints nothing; DIR/env holds SLURM_CONF
#   tools/slurm_local_cluster.sh stop DIR
#
# Two nodes, not one: the backfill scheduler (the only one that starts
# heterogeneous jobs) reserves whole nodes for the components it plans, so
# the two components of a hetjob never start together on one node. Each
# node declares CPUS (default 8) CPUs whatever the machine has
# (SlurmdParameters=config_overrides); no GPUs.
# Runs without cgroups (proctrack/linuxproc, task/none, no accounting), so it
# also works in a container. With WATCH_PID, a watchdog stops the cluster
# when that process ends, so a killed test leaves no daemons behind.
set -euo pipefail

cmd=${1:?usage: slurm_local_cluster.sh start|stop DIR [WATCH_PID]}
dir=${2:?usage: slurm_local_cluster.sh start|stop DIR [WATCH_PID]}
watch_pid=${3:-}
CPUS=${CPUS:-8}

stop_cluster() {
  local pidfile pid
  for pidfile in "$dir"/run/slurmd-*.pid "$dir"/run/slurmctld.pid "$dir"/run/munged.pid "$dir"/run/watchdog.pid; do
    [[ -s $pidfile ]] || continue
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
  done
  # Daemons get 5 s to go, then SIGKILL; job steps they started go with them.
  for _ in $(seq 50); do
    local alive=0
    for pidfile in "$dir"/run/slurmd-*.pid "$dir"/run/slurmctld.pid "$dir"/run/munged.pid; do
      [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null && alive=1
    done
    ((alive)) || break
    sleep 0.1
  done
  for pidfile in "$dir"/run/slurmd-*.pid "$dir"/run/slurmctld.pid "$dir"/run/munged.pid; do
    [[ -s $pidfile ]] && kill -KILL "$(cat "$pidfile")" 2>/dev/null || true
  done
  # What the cluster started outlives a SIGKILLed slurmd: slurmstepd, the
  # batch shell, srun and the tasks. All carry this cluster's SLURM_CONF
  # (as does this script when the watchdog runs it: not itself nor its parent).
  local env p
  for env in /proc/[0-9]*/environ; do
    p=${env#/proc/}; p=${p%/environ}
    [[ $p == "$$" || $p == "$PPID" ]] && continue
    { tr '\0' '\n' < "$env"; } 2>/dev/null | grep -qx "SLURM_CONF=$dir/slurm.conf" && kill -KILL "$p" 2>/dev/null || true
  done
  rm -f "$dir"/run/*.pid
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

if [[ $cmd == stop ]]; then
  stop_cluster
  exit 0
fi
[[ $cmd == start ]] || { echo "slurm_local_cluster.sh: unknown command '$cmd' (start or stop)" >&2; exit 2; }
for bin in munged mungekey slurmctld slurmd sbatch; do
  command -v "$bin" >/dev/null || { echo "slurm_local_cluster.sh: $bin not found (apt-get install slurm-wlm munge)" >&2; exit 2; }
done

dir=$(realpath -m "$dir")
mkdir -p "$dir"/{munge,key,state,spool/e3n1,spool/e3n2,log,run}
chmod 700 "$dir/key"
chmod 711 "$dir/munge"  # clients reach the socket; the key stays private
mungekey --create --keyfile="$dir/key/munge.key" --force
munged --force --socket="$dir/munge/socket" --key-file="$dir/key/munge.key" \
  --pid-file="$dir/run/munged.pid" --seed-file="$dir/run/munged.seed" --log-file="$dir/log/munged.log"

host=$(hostname -s)
ctld_port=$(free_port)
d1_port=$(free_port)
d2_port=$(free_port)
srun_lo=$(( 30000 + (RANDOM % 300) * 100 ))
cat > "$dir/slurm.conf" <<EOF
ClusterName=e3local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SrunPortRange=$srun_lo-$((srun_lo + 99))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
PlugStackConfig=$dir/plugstack.conf
MailProg=/bin/true
# No cgroups: works in a container.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Heterogeneous jobs start only from the backfill scheduler: run it every second.
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,bf_hetjob_immediate
SlurmdParameters=config_overrides
ReturnToService=2
# scancel: SIGTERM to every task, SIGKILL KillWait seconds later.
KillWait=30
MinJobAge=600
NodeName=e3n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$d1_port CPUs=$CPUS RealMemory=4000 State=UNKNOWN
NodeName=e3n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$d2_port CPUs=$CPUS RealMemory=4000 State=UNKNOWN
PartitionName=e3 Nodes=e3n1,e3n2 Default=YES MaxTime=INFINITE State=UP
EOF
: > "$dir/plugstack.conf"
printf 'export SLURM_CONF=%q\n' "$dir/slurm.conf" > "$dir/env"
export SLURM_CONF=$dir/slurm.conf

slurmctld -i -f "$SLURM_CONF" >"$dir/log/slurmctld.out" 2>&1
slurmd -N e3n1 -f "$SLURM_CONF" >"$dir/log/slurmd-e3n1.out" 2>&1
slurmd -N e3n2 -f "$SLURM_CONF" >"$dir/log/slurmd-e3n2.out" 2>&1

if [[ -n $watch_pid ]]; then
  (
    while kill -0 "$watch_pid" 2>/dev/null && [[ -e $dir/run/slurmctld.pid ]]; do sleep 1; done
    [[ -e $dir/run/slurmctld.pid ]] && "$0" stop "$dir"
  ) </dev/null >/dev/null 2>&1 &
  echo $! > "$dir/run/watchdog.pid"
fi

# Ready when both nodes are idle.
for _ in $(seq 300); do
  if [[ $(sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle$') == 2 ]]; then exit 0; fi
  sleep 0.1
done
echo "slurm_local_cluster.sh: the nodes did not come up within 30 s; logs in $dir/log:" >&2
tail -n 20 "$dir"/log/*.log >&2 || true
stop_cluster
exit 1

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# An elastic job launched by a real cluster manager: the test configures and
# starts Debian's Slurm on this machine (slurmctld and one slurmd, in a
# directory of its own, ports of its own, auth/none: nothing outside it is
# touched) and a single etcd member, then runs elastic_train with
# `srun -n 3` on the etcd store. Task 1's process is SIGKILLed mid-job: the
# group shrinks 3 -> 2, the job finishes, its parameters equal the
# single-process run's and every sample of every step is trained exactly
# once. Everything is stopped when the test ends (trap).
# Needs root (slurmd), Slurm (Debian slurm-wlm: slurmctld, slurmd, srun) and
# etcd; exits 77 (skipped), saying why, where they are missing or Slurm
# cannot run here.
# Usage: slurm_etcd.sh ELASTIC_TRAIN
set -euo pipefail
train=$(realpath "$1") here=$(cd "$(dirname "$0")" && pwd)
. "$here/job_checks.sh"
for tool in slurmctld slurmd srun sinfo etcd; do
  if ! command -v "$tool" >/dev/null && ! [[ -x /usr/sbin/$tool ]]; then
    echo "skipped: $tool is not installed (Debian: apt-get install slurm-wlm etcd-server etcd-client)"
    exit 77
  fi
done
if [[ $(id -u) -ne 0 ]]; then
  echo "skipped: slurmd must run as root to start tasks (run the test as root)"
  exit 77
fi
export PATH=$PATH:/usr/sbin
work=$(mktemp -d /tmp/ebbflow-slurm.XXXXXX)
pids=()
cleanup() {
  local rc=$? p
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [[ $rc -eq 0 || $rc -eq 77 ]]; then rm -rf "$work"; else echo "kept $work"; fi
}
trap cleanup EXIT INT TERM
cd "$work"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
host=$(hostname -s)
mkdir -p state spool
cat >slurm.conf <<CONF
ClusterName=ebbflow-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
export SLURM_CONF=$work/slurm.conf
slurmctld -D -f "$SLURM_CONF" >>slurmctld.out 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >>slurmd.out 2>&1 &
pids+=($!)
up=0
for _ in $(seq 100); do
  if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed)'; then
    up=1
    break
  fi
  sleep 0.2
done
if ((!up)); then
  echo "skipped: Slurm could not run here (the node did not become idle in 20 s):"
  sinfo 2>&1 | tail -3
  tail -5 slurmctld.log slurmd.log slurmctld.out slurmd.out 2>/dev/null
  exit 77
fi
echo "Slurm is up: $(sinfo -h -o '%P %D %T %c' | head -1) ($(slurmctld -V))"
cport=$(free_port)
etcd --name m0 --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$cport" \
  --advertise-client-urls "http://127.0.0.1:$cport" --listen-peer-urls "http://127.0.0.1:$(free_port)" \
  --log-level warn >>etcd.log 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$cport" endpoint health >/dev/null 2>&1 && break
  sleep 0.1
done
steps=800
common=(--steps "$steps" --sample-us 150 --step-us 1500)
export EBBFLOW_STORE=etcd://127.0.0.1:$cport/slurm EBBFLOW_TOKEN=slurm-etcd EBBFLOW_STORE_OUTAGE_MS=60000
# Each task writes down its pid (to be killed) and its Slurm rank.
cat >task <<'SH'
#!/usr/bin/env bash
echo $$ >"pid.$SLURM_PROCID"
exec "$@"
SH
chmod +x task
(
  rc=0
  EBBFLOW_LOG=info timeout 180 srun -n 3 --kill-on-bad-exit=0 --chdir "$work" --job-name ebbflow-elastic \
    ./task "$train" "${common[@]}" --params-out elastic.bin --trace . >job.log 2>&1 || rc=$?
  echo "$rc" >job.rc
) &
job=$!
wait_formed job.log
sleep 1
victim=$(cat pid.1)
kill -9 "$victim"
echo "SIGKILLed Slurm task 1 (pid $victim) of step $(squeue -h -s -o '%i' | head -1)"
wait $job || true
echo "srun exited $(cat job.rc) (a task was killed)"
grep -qF "world changed (failure): 3 -> 2" job.log || {
  echo "FAIL: the group did not shrink from 3 to 2 workers"
  tail -30 job.log
  exit 1
}
grep -F "world changed (failure)" job.log | head -2
done_steps=$(sed -n 's/.*finished \([0-9]*\) steps.*/\1/p' job.log | head -1)
[[ $done_steps == "$steps" ]] || {
  echo "FAIL: the job did not finish its $steps steps"
  tail -30 job.log
  exit 1
}
"$train" "${common[@]}" --reference --params-out ref.bin --trace . >ref.log 2>&1
check_job "$steps"
echo "PASS (an elastic job under srun on the etcd store, one task killed)"

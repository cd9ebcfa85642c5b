#!/usr/bin/env bash
# CI: a real single-node Slurm cluster on this machine (Debian, no systemd), so that
# tests/integration/test_slurm.py runs the workflow through sbatch with the real executor
# plugin. Idempotent: a second call reuses the packages and any daemon that still runs.
# Needs root (or sudo). Stop it with .ci/slurm-stop.sh.
#
# No slurmdbd: without accounting `sacct` has no data, so the executor must poll with
# `--slurm-status-command squeue`, and MinJobAge keeps finished jobs visible to squeue.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
GRES_CONF=/etc/slurm/gres.conf
# The GPU model the test node offers: sbatch --gpus=<type>:1 asks for it by name.
GPU_TYPE=ci_card
LOG_DIR=/var/log/slurm
STATE_DIR=/var/lib/slurm/slurmctld
SPOOL_DIR=/var/spool/slurmd
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
MUNGE_PID=/run/munge/munged.pid
# The node is called localhost whatever the machine's hostname (it was "vm" here):
# slurmd -N localhost makes slurmd answer to the name slurm.conf uses.
NODE=localhost
# Bounded waits, in seconds: the node has been idle within ~3 s wherever this was tried.
WAIT_IDLE=${SLURM_WAIT_IDLE:-60}

if [[ $EUID -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "slurm.sh: needs root (or sudo)" >&2; exit 1; }
    exec sudo --preserve-env=SLURM_WAIT_IDLE "$0" "$@"
fi

log() { echo "slurm.sh: $*"; }

fail() {
    echo "slurm.sh: $*" >&2
    for file in "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" /var/log/munge/munged.log; do
        if [[ -f $file ]]; then
            echo "---- tail of $file" >&2
            tail -n 40 "$file" >&2
        fi
    done
    exit 1
}

# True when the PID file names a live daemon of that file's name (a stale file may name a
# PID the kernel has since given to another program).
running() {
    local pid
    [[ -s $1 ]] || return 1
    pid=$(<"$1")
    [[ $pid =~ ^[0-9]+$ ]] && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$(basename "$1" .pid)" ]]
}

# ---- Packages (22.05 on bookworm); the munge postinst also creates /etc/munge/munge.key.
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
    || ! command -v sinfo >/dev/null || ! command -v munged >/dev/null; then
    log "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq slurm-wlm munge >/dev/null
fi

# ---- slurm.conf, from this machine's size
cpus=$(nproc)
mem_total_mb=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 ))
# Leave 10 % (at least 512 MB) to the OS, the daemons and the Snakemake head process:
# slurmd drains a node whose RealMemory exceeds what it measures.
margin_mb=$(( mem_total_mb / 10 > 512 ? mem_total_mb / 10 : 512 ))
real_mem_mb=$(( mem_total_mb - margin_mb ))
(( real_mem_mb > 0 )) || fail "too little memory: ${mem_total_mb} MB"

new_conf=$(mktemp)
new_gres=$(mktemp)
trap 'rm -f "$new_conf" "$new_gres"' EXIT
cat >"$new_conf" <<EOF
# Written by .ci/slurm.sh: a single-node test cluster without accounting.
ClusterName=coordgap-ci
SlurmctldHost=localhost
# Root runs everything: a throwaway CI cluster, jobs write into the test's tmp folder.
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
# No cgroups: containers and VMs without systemd rarely delegate them.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
# The executor polls with squeue: finished jobs must stay listed for a while (the plugin
# falls back to sacct when MinJobAge is under 3x its first status-check delay). The tests read
# every job's record after their run, which beside another pytest worker takes over 10 min:
# a record kept 600 s was gone by then (scontrol show job failed).
MinJobAge=3600
# A restarted slurmd brings the node back without an admin's scontrol update.
ReturnToService=2
# Trust this file's CPUs and RealMemory over what slurmd detects (VMs report odd topologies).
SlurmdParameters=config_overrides
StateSaveLocation=$STATE_DIR
SlurmdSpoolDir=$SPOOL_DIR
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
# One GPU-like generic resource, so that GPU jobs ask Slurm for a GPU (sbatch --gpus) as on
# a real cluster; it has no device file: a job given it sees no device.
GresTypes=gpu
NodeName=$NODE CPUs=$cpus RealMemory=$real_mem_mb Gres=gpu:$GPU_TYPE:1 State=UNKNOWN
# Two partitions over the one node, as sites split CPU and GPU work: tests check that each
# job lands in the partition the site file names for its kind (tests/integration/test_slurm.py).
PartitionName=cpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=ALL MaxTime=INFINITE State=UP
EOF
echo "NodeName=$NODE Name=gpu Type=$GPU_TYPE File=/dev/null" >"$new_gres"

conf_changed=0
if ! cmp -s "$new_conf" "$CONF" || ! cmp -s "$new_gres" "$GRES_CONF"; then
    mkdir -p "$(dirname "$CONF")"
    install -m 0644 "$new_conf" "$CONF"
    install -m 0644 "$new_gres" "$GRES_CONF"
    conf_changed=1
    log "wrote $CONF (CPUs=$cpus RealMemory=$real_mem_mb) and $GRES_CONF"
fi

# ---- munged
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating /etc/munge/munge.key"
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
fi
if ! running "$MUNGE_PID"; then
    log "starting munged"
    # --force: a stale socket from a killed munged would otherwise stop it.
    runuser -u munge -- /usr/sbin/munged --force --pid-file="$MUNGE_PID" \
        || fail "munged did not start"
fi
munge -n | unmunge >/dev/null || fail "munge cannot encode and decode a credential"

# ---- slurmctld and slurmd
mkdir -p "$LOG_DIR" "$STATE_DIR" "$SPOOL_DIR"
if (( conf_changed )); then
    # Daemons read slurm.conf at start; a new node size needs both restarted.
    for pid_file in "$SLURMD_PID" "$CTLD_PID"; do
        if running "$pid_file"; then
            pid=$(<"$pid_file")
            log "restarting for the new slurm.conf: stopping $pid"
            kill "$pid"
            # Wait on the process, not its PID file: the daemon may remove the file first.
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
            if kill -0 "$pid" 2>/dev/null; then fail "$pid still runs 10 s after SIGTERM"; fi
        fi
    done
fi
if ! running "$CTLD_PID"; then
    log "starting slurmctld"
    # -c: a controller this script starts has no jobs to keep. Jobs recovered from the saved
    # state of a killed run hold the node "allocated" though their processes are gone, and the
    # node never turns idle (CI failed so after a test run on this machine was killed).
    # -i: start even if the saved state of an earlier cluster does not parse.
    /usr/sbin/slurmctld -c -i || fail "slurmctld did not start"
fi
# slurmd registers with slurmctld: give slurmctld a moment to listen.
for _ in $(seq 50); do scontrol ping >/dev/null 2>&1 && break; sleep 0.2; done
scontrol ping >/dev/null 2>&1 || fail "slurmctld does not answer scontrol ping"
if ! running "$SLURMD_PID"; then
    log "starting slurmd"
    /usr/sbin/slurmd -N "$NODE" || fail "slurmd did not start"
fi

# ---- Wait until the node takes jobs
deadline=$(( SECONDS + WAIT_IDLE ))
until [[ -n $(sinfo -h -N -n "$NODE" -t idle -o %N 2>/dev/null) ]]; do
    state=$(sinfo -h -N -n "$NODE" -o %T 2>/dev/null || true)
    # A node drained by an earlier run (a killed job, a restart) would never turn idle.
    if [[ $state == drain* || $state == down* ]]; then
        scontrol update NodeName="$NODE" State=RESUME 2>/dev/null || true
    fi
    if (( SECONDS >= deadline )); then
        sinfo -N -l >&2 || true
        scontrol show node "$NODE" >&2 || true
        fail "node $NODE not idle after ${WAIT_IDLE}s (state: ${state:-unknown})"
    fi
    sleep 1
done
log "ready"
sinfo

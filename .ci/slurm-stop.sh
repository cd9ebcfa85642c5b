#!/usr/bin/env bash
# CI: stop the cluster .ci/slurm.sh started. Only the PIDs its daemons wrote are signalled,
# never processes found by name: other Slurm or munge processes on the machine are left alone.
# Safe to run twice or when nothing runs.
set -euo pipefail

if [[ $EUID -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "slurm-stop.sh: needs root (or sudo)" >&2; exit 1; }
    exec sudo "$0" "$@"
fi

# slurmd first (it reports to slurmctld), munged last (both authenticate through it).
status=0
for pid_file in /run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid; do
    [[ -s $pid_file ]] || continue
    pid=$(<"$pid_file")
    name=$(basename "$pid_file" .pid)
    # A stale PID file may name a PID the kernel has since given to another program.
    if ! [[ $pid =~ ^[0-9]+$ ]] || [[ $(cat "/proc/$pid/comm" 2>/dev/null) != "$name" ]]; then
        rm -f "$pid_file"
        continue
    fi
    echo "slurm-stop.sh: stopping $name ($pid)"
    kill "$pid"
    # SIGTERM is a clean shutdown (slurmctld saves its state); SIGKILL only if it hangs.
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
        echo "slurm-stop.sh: $pid ignored SIGTERM for 10 s, sending SIGKILL" >&2
        kill -9 "$pid" 2>/dev/null || status=1
    fi
    rm -f "$pid_file"
done
exit "$status"

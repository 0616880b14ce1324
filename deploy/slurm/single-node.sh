#!/usr/bin/env bash
# A one-machine Slurm cluster, to run a job's Slurm and PMIx rows for real (docs/deployment.md,
# cli/tests/suite/launchers.rs): munge, slurmctld and slurmd on this host, one partition, as root.
# Debian: apt-get install slurm-wlm libpmix-dev (munge comes with it; libpmix-dev for
# `srun --mpi=pmix`). Idempotent: a controller that answers already is left
# as it is. Stop it with: pkill slurmd; pkill slurmctld; pkill munged.
set -euo pipefail

if timeout 5 sinfo -h >/dev/null 2>&1; then
    echo "slurm: a controller answers already"
    exit 0
fi
for c in munged slurmctld slurmd srun sinfo; do
    command -v "$c" >/dev/null 2>&1 || {
        echo "slurm: no $c here (Debian: apt-get install slurm-wlm libpmix-dev)" >&2
        exit 1
    }
done
[ "$(id -u)" = 0 ] || { echo "slurm: this script configures the daemons as root" >&2; exit 1; }

# Whether a daemon runs (a zombie left by an earlier one, not reaped where init does not,
# does not count).
running() { ps -C "$1" -o stat= 2>/dev/null | grep -qv '^Z'; }

host="$(hostname -s)"
# The node as slurmd sees it (CPUs, sockets, cores, memory).
node="$(slurmd -C | head -n 1) NodeAddr=127.0.0.1"
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=collectix
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
$node State=UNKNOWN
PartitionName=main Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
# No cgroups: linuxproc tracks the processes (no cgroup.conf).
rm -f /etc/slurm/cgroup.conf

if ! running munged; then
    [ -s /etc/munge/munge.key ] || {
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
        chmod 400 /etc/munge/munge.key
    }
    chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
    su -s /bin/sh munge -c munged 2>/dev/null || munged --force
fi
running slurmctld || slurmctld
running slurmd || slurmd
for _ in $(seq 1 30); do
    if timeout 2 sinfo -h -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
        echo "slurm: $(sinfo -h -o '%P %D %t %c')"
        exit 0
    fi
    sleep 1
done
echo "slurm: the node did not come up; see /var/log/slurm/" >&2
timeout 5 sinfo >&2 || true
tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
exit 1

#!/usr/bin/env bash
# Debian's SLURM and munge for `make test-slurm`, installed where a program is missing. Needs root (CI runs as
# root); anywhere else it says what to install and fails: the cluster test never passes without a cluster.
set -euo pipefail
PACKAGES="slurmctld slurmd slurm-client munge"
missing=""
for program in slurmctld slurmd sbatch squeue sinfo scontrol scancel munged mungekey; do
    command -v "$program" >/dev/null || missing="$missing $program"
done
if [ -z "$missing" ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "slurm_install: missing:$missing; install Debian's $PACKAGES as root (apt-get), then run make test-slurm" >&2
    exit 1
fi
echo "slurm_install: missing:$missing; installing $PACKAGES"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends $PACKAGES

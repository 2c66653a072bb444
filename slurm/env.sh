# shellcheck shell=bash
# Site settings sourced by every slurm/*.slurm script and by submit_pipeline.sh.
# Defaults match the cluster the CDK app creates (stacks/shared/presets.py, DEFAULT_PRESET g4dn.12xlarge;
# a test keeps the two in step). Every value can be overridden from the environment, which sbatch
# passes into the job: e.g. `SCDINO_PARTITION=gpu-p4d24xl sbatch ...`. The local cluster's
# overrides are in .local-slurm/scdino-env.sh (written by scripts/local-slurm.sh start).
# This file only sets variables (and reads the node's monitoring settings): sourcing it anywhere is safe.

# --- cluster shape ---
# Slurm partition (ParallelCluster queue) of the default GPU instance type.
SCDINO_PARTITION=${SCDINO_PARTITION:-gpu-g4dn12xl}
# GPUs per node the site expects; the launcher takes the real count from the allocation.
SCDINO_GPUS_PER_NODE=${SCDINO_GPUS_PER_NODE:-4}
# vCPUs per GPU (48 vCPUs / 4 GPUs): data-loading workers of one GPU task live on them.
SCDINO_CPUS_PER_GPU=${SCDINO_CPUS_PER_GPU:-12}
# CPUs of a single-process step (prepare, mean-std, kNN, ...): one GPU's share of a node.
SCDINO_CPUS_PER_TASK=${SCDINO_CPUS_PER_TASK:-$SCDINO_CPUS_PER_GPU}
# CPUs of each `ingest` job or array task: its cropping runs on one core, a second reads ahead;
# an array of many such tasks, packed onto the nodes by Slurm, spreads the fields over the cores.
SCDINO_INGEST_CPUS_PER_TASK=${SCDINO_INGEST_CPUS_PER_TASK:-2}
# Instance type, for the expected all-reduce bandwidth in the NCCL test.
SCDINO_INSTANCE_TYPE=${SCDINO_INSTANCE_TYPE:-g4dn.12xlarge}
# Worker processes per node when the allocation has no GPU (CPU/gloo runs, the local cluster).
SCDINO_CPU_PROCS_PER_NODE=${SCDINO_CPU_PROCS_PER_NODE:-1}

# --- paths ---
# The installed training/ + slurm/ bundle (bootstrap copies it to the shared /apps volume).
SCDINO_HOME=${SCDINO_HOME:-/apps/scdino}
# Its Python environment (torch, timm, ...), identical on every node.
SCDINO_VENV=${SCDINO_VENV:-$SCDINO_HOME/.venv}
SCDINO_PYTHON=${SCDINO_PYTHON:-$SCDINO_VENV/bin/python}
# FSx for Lustre mount; <mount>/data is linked to s3://<bucket>/data/.
SCDINO_FSX=${SCDINO_FSX:-/fsx}
SCDINO_DATA_DIR=${SCDINO_DATA_DIR:-$SCDINO_FSX/data}
# Node-local NVMe (instance store) that ParallelCluster mounts on every compute node.
SCDINO_SCRATCH=${SCDINO_SCRATCH:-/scratch}
# Rendezvous port on the first node; derived from the job id so concurrent jobs do not collide.
SCDINO_RDZV_PORT=${SCDINO_RDZV_PORT:-$((29500 + ${SLURM_JOB_ID:-0} % 1000))}

# --- monitoring ---
# On GPU compute nodes the bootstrap (bootstrap/on-node-configured.sh) writes SCDINO_EMF_LOG and
# SCDINO_EMF_NAMESPACE here: rank 0 then writes CloudWatch embedded-metric-format lines, which the
# agent ships to the cluster's dashboard (training/metrics.py). Absent elsewhere: no such lines.
SCDINO_MONITORING_ENV=${SCDINO_MONITORING_ENV:-/etc/scdino/monitoring.env}
if [ -r "$SCDINO_MONITORING_ENV" ]; then
  # shellcheck source=/dev/null
  source "$SCDINO_MONITORING_ENV"
fi

# --- environment of the training processes ---
# The bundle is importable without being installed into the venv.
export PYTHONPATH=$SCDINO_HOME${PYTHONPATH:+:$PYTHONPATH}
# EFA with libfabric >= 1.18 and aws-ofi-nccl >= 1.7 (ParallelCluster 3.16 AMIs) needs only this:
# huge pages make os.fork() fail with ENOMEM once DataLoader workers fork (efa-cheatsheet).
export FI_EFA_USE_HUGE_PAGE=${FI_EFA_USE_HUGE_PAGE:-0}
# NCCL errors and warnings (including "no EFA plugin") reach the job log; INFO for debugging.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# c10d logs a harmless reverse-lookup warning on every rank without it.
export TORCH_CPP_LOG_LEVEL=${TORCH_CPP_LOG_LEVEL:-ERROR}
# Not set on purpose (outdated for current libfabric/aws-ofi-nccl, see docs/slurm.md):
# FI_PROVIDER, FI_EFA_USE_DEVICE_RDMA, FI_EFA_FORK_SAFE, NCCL_PROTO, RDMAV_*.

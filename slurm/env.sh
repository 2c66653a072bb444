# shellcheck shell=bash
# Site settings sourced by every slurm/*.slurm script and by submit_pipeline.sh.
# The cluster's shape comes from the site file the node bootstrap writes beside the bundle
# ($SCDINO_HOME/cluster.env, from the deploy's pointer): its enabled presets, the default first.
# Without one (a checkout, the local cluster's default) the defaults below are the CDK app's default
# preset (stacks/shared/presets.py, DEFAULT_PRESET g4dn.12xlarge; a test keeps the two in step).
# Every value can be overridden from the environment, which sbatch passes into the job: e.g.
# `SCDINO_CPUS_PER_TASK=8 sbatch ...`. The local cluster's overrides are in
# .local-slurm/scdino-env.sh (written by scripts/local-slurm.sh start).
# This file only sets variables (and reads the site and monitoring files): sourcing it anywhere is safe.

# --- paths ---
# The installed training/ + slurm/ bundle (bootstrap copies it to the shared /apps volume). /apps/scdino
# is a link that each code update switches: resolved here once, to the bundle's own folder, so that a job
# keeps the code it was submitted with (submit_pipeline.sh exports it, and sbatch gives it to the job and
# to the job requeued) or, submitted by hand, the code it started with.
SCDINO_HOME=${SCDINO_HOME:-/apps/scdino}
if _scdino_real=$(readlink -f "$SCDINO_HOME" 2>/dev/null) && [ -d "$_scdino_real" ]; then
  SCDINO_HOME=$_scdino_real
fi
# The mark a job's comment carries to keep its bundle through later updates ("scdino-bundle:<folder>"):
# the node bootstrap removes no bundle that a pending or running job names (bootstrap/on-node-configured.sh).
# Empty outside an installed bundle (one with the bootstrap's .ready marker, e.g. a checkout).
SCDINO_BUNDLE_MARK=""
if [ -f "$SCDINO_HOME/.ready" ]; then
  SCDINO_BUNDLE_MARK="scdino-bundle:$SCDINO_HOME"
fi
# Where the node bootstrap builds one Python environment per set of pinned requirements, on FSx.
SCDINO_SHARED_VENVS=${SCDINO_SHARED_VENVS:-/fsx/.scdino/venvs}
# Its Python environment (torch, timm, ...). The bundle's .venv is this node's environment, which follows
# the active bundle's requirements: a job of an older bundle, or on a static node that booted before a
# change of requirements, takes instead one built from its own bundle's requirements, by the bootstrap's
# requirements id: the image's, set aside beside this node's, or the shared one on FSx. Without any, the
# bundle's .venv, and SCDINO_VENV_NOTE says so (slurm/lib.sh logs it).
SCDINO_VENV_NOTE=""
# The bootstrap's id of the pinned requirements in folder $1 (on-node-configured.sh's requirements_id: the
# files' text hashed, a missing one empty).
_scdino_requirements_id() {
  { cat "$1/requirements.txt" "$1/requirements-dali.txt" 2>/dev/null || true; } | sha256sum | cut -c1-16
}
if [ -z "${SCDINO_VENV:-}" ]; then
  SCDINO_VENV=$SCDINO_HOME/.venv
  if [ -n "$SCDINO_BUNDLE_MARK" ]; then
    _scdino_requirements=$(_scdino_requirements_id "$SCDINO_HOME")
    SCDINO_VENV_NOTE="no environment on this node was built from the bundle's requirements ($_scdino_requirements)"
    _scdino_node=$(readlink "$SCDINO_VENV") || _scdino_node=$SCDINO_VENV  # /opt/scdino-venv on a cluster node
    for _scdino_env in "$SCDINO_VENV" "$_scdino_node.image" "$SCDINO_SHARED_VENVS/$_scdino_requirements"; do
      _scdino_real=$(readlink -f "$_scdino_env" 2>/dev/null) || continue
      if [ -f "$_scdino_real/scdino-requirements/requirements.txt" ]; then  # an image's (ami/scripts/20-python-env.sh)
        _scdino_id=$(_scdino_requirements_id "$_scdino_real/scdino-requirements")
      elif [ -f "$_scdino_real/.ready" ]; then  # a shared one, named by its id
        _scdino_id=${_scdino_real##*/}
      else
        continue
      fi
      if [ "$_scdino_id" = "$_scdino_requirements" ]; then
        SCDINO_VENV=$_scdino_env
        # shellcheck disable=SC2034  # slurm/lib.sh's require_python logs it
        SCDINO_VENV_NOTE=""
        break
      fi
    done
  fi
fi
SCDINO_PYTHON=${SCDINO_PYTHON:-$SCDINO_VENV/bin/python}
# FSx for Lustre mount; <mount>/data is linked to s3://<bucket>/data/.
SCDINO_FSX=${SCDINO_FSX:-/fsx}
SCDINO_DATA_DIR=${SCDINO_DATA_DIR:-$SCDINO_FSX/data}
# Node-local NVMe (instance store) that ParallelCluster mounts on every compute node.
SCDINO_SCRATCH=${SCDINO_SCRATCH:-/scratch}
# Rendezvous port on the first node; derived from the job id so concurrent jobs do not collide.
SCDINO_RDZV_PORT=${SCDINO_RDZV_PORT:-$((29500 + ${SLURM_JOB_ID:-0} % 1000))}

# --- cluster shape ---
# The site file (bootstrap/cluster-env.py renders it): SCDINO_CLUSTER_PRESETS, one line per enabled
# preset, "instance-type partition GPUs-per-node vCPUs-per-GPU", the cluster's default partition first.
SCDINO_CLUSTER_ENV=${SCDINO_CLUSTER_ENV:-$SCDINO_HOME/cluster.env}
SCDINO_CLUSTER_PRESETS=""
if [ -r "$SCDINO_CLUSTER_ENV" ]; then
  # shellcheck source=/dev/null
  source "$SCDINO_CLUSTER_ENV"
fi
# The preset whose shape the values below take, as its line: the one SCDINO_PRESET names (its instance
# type or partition; submit_pipeline.sh --preset sets it), else inside a job the one of the partition it
# runs in, else the cluster's default. Empty without a site file.
SCDINO_SHAPE=""
for _scdino_want in "${SCDINO_PRESET:-}" "${SLURM_JOB_PARTITION:-}" "(default)"; do
  while read -r _scdino_type _scdino_queue _scdino_rest; do
    if [ -n "$_scdino_rest" ] && [ -n "$_scdino_want" ] && { [ "$_scdino_want" = "(default)" ] ||
      [ "$_scdino_want" = "$_scdino_type" ] || [ "$_scdino_want" = "$_scdino_queue" ]; }; then
      SCDINO_SHAPE="$_scdino_type $_scdino_queue $_scdino_rest"
      break 2
    fi
  done <<<"$SCDINO_CLUSTER_PRESETS"
done
read -r _scdino_type _scdino_queue _scdino_gpus _scdino_cpus _scdino_rest <<<"$SCDINO_SHAPE"
# Slurm partition (ParallelCluster or PCS queue) of that preset.
SCDINO_PARTITION=${SCDINO_PARTITION:-${_scdino_queue:-gpu-g4dn12xl}}
# GPUs per node the site expects; the launcher takes the real count from the allocation.
SCDINO_GPUS_PER_NODE=${SCDINO_GPUS_PER_NODE:-${_scdino_gpus:-4}}
# vCPUs per GPU (48 vCPUs / 4 GPUs on g4dn.12xlarge): data-loading workers of one GPU task live on them.
SCDINO_CPUS_PER_GPU=${SCDINO_CPUS_PER_GPU:-${_scdino_cpus:-12}}
# Instance type, for the expected all-reduce bandwidth in the NCCL test.
SCDINO_INSTANCE_TYPE=${SCDINO_INSTANCE_TYPE:-${_scdino_type:-g4dn.12xlarge}}
unset _scdino_want _scdino_type _scdino_queue _scdino_gpus _scdino_cpus _scdino_rest _scdino_real \
  _scdino_requirements _scdino_node _scdino_env _scdino_id
unset -f _scdino_requirements_id
# CPUs of a single-process step (prepare, mean-std, kNN, ...): one GPU's share of a node.
SCDINO_CPUS_PER_TASK=${SCDINO_CPUS_PER_TASK:-$SCDINO_CPUS_PER_GPU}
# CPUs of each `ingest` job or array task: its cropping runs on one core, a second reads ahead;
# an array of many such tasks, packed onto the nodes by Slurm, spreads the fields over the cores.
SCDINO_INGEST_CPUS_PER_TASK=${SCDINO_INGEST_CPUS_PER_TASK:-2}
# Worker processes per node when the allocation has no GPU (CPU/gloo runs, the local cluster).
SCDINO_CPU_PROCS_PER_NODE=${SCDINO_CPU_PROCS_PER_NODE:-1}

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

# shellcheck shell=bash
# Functions shared by the slurm/*.slurm scripts; sourced after env.sh inside a job.
# Each script calls what it needs in its launch section; only record_bundle runs on its own (at the end).

log() { echo "[$(date +%H:%M:%S) ${SLURM_JOB_NAME:-job} ${SLURM_JOB_ID:-}] $*" >&2; }

# Fails early, with the fix, when the bundle's Python environment is missing on this node; notes it when
# the environment was built from other requirements than the bundle's (slurm/env.sh).
require_python() {
  if [ ! -x "$SCDINO_PYTHON" ]; then
    log "error: no Python at $SCDINO_PYTHON; set SCDINO_VENV (slurm/env.sh) to the venv that has the training bundle"
    exit 2
  fi
  if [ -n "${SCDINO_VENV_NOTE:-}" ]; then
    log "note: $SCDINO_VENV_NOTE: running with $SCDINO_VENV (docs/deploy.md, \"Update the code\")"
  fi
  return 0
}

# Names this job's bundle in its comment (slurm/env.sh's SCDINO_BUNDLE_MARK), so that a code update removes
# it only once the job has ended (bootstrap/on-node-configured.sh asks squeue). submit_pipeline.sh gives the
# mark at submission and says so in SCDINO_JOB_COMMENT; a job submitted by hand gets it here, when it
# starts: its bundle, active then, is kept as the active or the previous one until that is done. Another
# comment the job has is kept; a mark of another bundle (a requeued job that started again on newer code)
# is replaced. Never fails the job: without the mark the bundle is kept as the active or previous one only.
record_bundle() {
  local comment
  [ -n "${SLURM_JOB_ID:-}" ] && [ -n "${SCDINO_BUNDLE_MARK:-}" ] || return 0
  [ "${SCDINO_JOB_COMMENT:-}" != "$SCDINO_BUNDLE_MARK" ] || return 0
  comment=$(squeue --noheader --jobs="$SLURM_JOB_ID" --format=%k 2>/dev/null) || comment="?"
  case " $comment " in
    *" $SCDINO_BUNDLE_MARK "*) return 0 ;;
    " ? ")
      log "warning: squeue could not read this job's comment: its bundle is not named there"
      return 0
      ;;
  esac
  comment=$(sed -e 's/(null)//' -e 's/scdino-bundle:[^ ]*//g' -e 's/^ *//' -e 's/ *$//' <<<"$comment")
  scontrol update JobId="$SLURM_JOB_ID" Comment="${comment:+$comment }$SCDINO_BUNDLE_MARK" ||
    log "warning: could not name the bundle in this job's comment (scontrol update failed)"
  return 0
}

# GPUs this allocation gives on each node: Slurm's count, else CUDA_VISIBLE_DEVICES, else what
# nvidia-smi lists; 0 means a CPU-only allocation (training then uses gloo).
gpus_per_node() {
  local count=0
  if [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then
    count=$SLURM_GPUS_ON_NODE
  elif [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    count=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
  elif command -v nvidia-smi >/dev/null 2>&1; then
    count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  fi
  if ((count > 0 && count != SCDINO_GPUS_PER_NODE)); then
    log "note: $count GPUs per node in this allocation, the site default is $SCDINO_GPUS_PER_NODE"
  fi
  echo "$count"
}

head_node() { scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1; }

# Threads of a step's processes (OMP_NUM_THREADS, which torch follows), for PROCS processes a node.
# On the local cluster every node is this one machine (SCDINO_SHARED_CORES, from
# scripts/local-slurm.sh), so a job's processes divide its cores: a one-node step takes them all,
# each of pretraining's two nodes half, each task of an array its share. A step that wants a fixed
# count (ingest: one) sets SCDINO_STEP_THREADS. Elsewhere OMP_NUM_THREADS is left as it is.
share_cores() {
  local procs=${1:-1} threads
  if [ -n "${SCDINO_STEP_THREADS:-}" ]; then
    export OMP_NUM_THREADS=$SCDINO_STEP_THREADS
    return 0
  fi
  [ -n "${SCDINO_SHARED_CORES:-}" ] || return 0
  threads=$((SCDINO_SHARED_CORES / (${SLURM_JOB_NUM_NODES:-1} * procs * ${SLURM_ARRAY_TASK_COUNT:-1})))
  export OMP_NUM_THREADS=$((threads > 0 ? threads : 1))
}

# Runs one single-process pipeline step in the batch shell: python -m training STEP --config ...
run_step() {
  local step=$1
  shift
  require_python
  share_cores 1
  log "step $step on $(hostname), ${OMP_NUM_THREADS:-default} thread(s): $SCDINO_PYTHON -m training $step --config $*"
  "$SCDINO_PYTHON" -m training "$step" --config "$@"
}

# Runs `python ARGS...` on every node of the allocation: srun starts exactly one torchrun agent per
# node (more would rendezvous among themselves), the agents meet at a c10d rendezvous on the first
# node, and each starts one worker per GPU (SCDINO_CPU_PROCS_PER_NODE on CPU-only nodes).
torchrun_all_nodes() {
  local nproc head
  require_python
  nproc=$(gpus_per_node)
  ((nproc > 0)) || nproc=$SCDINO_CPU_PROCS_PER_NODE
  share_cores "$nproc"
  head=$(head_node)
  local launcher=(
    "$SCDINO_PYTHON" -m torch.distributed.run
    --nnodes="$SLURM_JOB_NUM_NODES"
    --nproc_per_node="$nproc"
    --rdzv_id="$SLURM_JOB_ID"
    --rdzv_backend=c10d
    --rdzv_endpoint="$head:$SCDINO_RDZV_PORT"
  )
  local srun_cmd=(
    srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1
    --cpus-per-task="${SLURM_CPUS_ON_NODE:-1}" --kill-on-bad-exit=1
  )
  # An --exclusive job holds every GPU of its nodes, but a step gets only GRES it asks for.
  [ -n "${SLURM_GPUS_ON_NODE:-}" ] && ((nproc > 0)) && srun_cmd+=(--gres="gpu:$nproc")
  log "$SLURM_JOB_NUM_NODES node(s) x $nproc process(es), rendezvous $head:$SCDINO_RDZV_PORT"
  # The torchrun agent has no USR1 handler and would die of it: the agent ignores USR1, the
  # workers install their own handler and still receive it.
  # shellcheck disable=SC2016
  "${srun_cmd[@]}" bash -c 'trap "" USR1; exec "$0" "$@"' "${launcher[@]}" "$@"
}

# Paths of a run, asked from the package (training/rundir/layout.py owns every file name):
# `run_path NAME[,NAME...] CONFIG [--set key=value ...]` prints one path per name, in order, e.g.
# root, packed, preempted_marker; one interpreter start however many names. Only the --set
# overrides among the step's arguments matter. Exits non-zero on a bad config, with the package's
# one-line error.
run_path() {
  local names config=$2 overrides=()
  IFS=, read -ra names <<<"$1"
  shift 2
  while (($#)); do
    if [ "$1" = --set ] && (($# > 1)); then
      overrides+=(--set "$2")
      shift 2
    else
      shift
    fi
  done
  "$SCDINO_PYTHON" -m training paths --config "$config" "${overrides[@]}" "${names[@]}"
}

run_dir() { run_path root "$@"; }

# Where a run's packed dataset goes on each node's NVMe (`scratch_packed_dir RUN_DIR`): one place
# for pretrain.slurm (SCDINO_STAGE_TO_SCRATCH=1) and stage_nvme.slurm, so either reuses the other's copy.
scratch_packed_dir() { echo "$SCDINO_SCRATCH/scdino/$(basename "$1")/packed"; }

# Copies directory SRC to DEST on the node-local NVMe of every node of the allocation (DEST is the
# same path on each); an existing copy is only brought up to date.
stage_to_scratch() {
  local src=$1 dest=$2
  [ -d "$src" ] || { log "error: nothing to stage: $src is not a directory (run prepare first)"; return 2; }
  log "staging $src -> $dest on $SLURM_JOB_NUM_NODES node(s)"
  # shellcheck disable=SC2016
  srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 \
    bash -c 'mkdir -p "$1" && cp -a --update "$0"/. "$1"/ && echo "$(hostname): $(du -sh "$1" | cut -f1) in $1"' \
    "$src" "$dest"
}

# USR1 reaches the batch shell before the time limit (--signal=B:USR1@N) or from
# `scancel --batch --signal=USR1`: pass it on to every process of the job's steps, where the
# training workers checkpoint and stop (training/trainer.py, "Pre-emption protocol").
forward_preemption() {
  log "USR1: asking the workers to checkpoint and stop"
  scancel --signal=USR1 "$SLURM_JOB_ID" || true
}

# Runs the training launch so that a pre-emption signal ends in a checkpoint and a requeue:
# training leaves MARKER (<run>/checkpoints/PREEMPTED) when it stopped early, and the requeued job
# resumes from the run directory. bash runs traps only between commands, so the launch runs in
# the background while the shell waits for it.
run_preemptible() {
  local marker=$1 pid rc
  shift
  trap forward_preemption USR1
  "$@" &
  pid=$!
  while :; do
    rc=0
    wait "$pid" || rc=$?
    # wait returns >128 when a trapped signal interrupted it; the launch may still be running.
    if ((rc > 128)) && kill -0 "$pid" 2>/dev/null; then continue; fi
    break
  done
  trap - USR1
  if ((rc == 0)) && [ -e "$marker" ]; then
    log "pre-empted ($(cat "$marker")); requeueing, restart $((${SLURM_RESTART_COUNT:-0} + 1))"
    requeue_self || return 1
  fi
  return "$rc"
}

# Requeues this job, then waits for Slurm to end this batch script rather than finish first and
# look like a success. A refused requeue returns 1 with the fix: the caller may run where `set -e`
# does not apply (run_healing), and must not carry on as if training had finished.
requeue_self() {
  scontrol requeue "$SLURM_JOB_ID" || {
    log "error: scontrol requeue failed; resubmit the job to resume from the last checkpoint"
    return 1
  }
  sleep 300
}

# lfs, via sudo where not root (HSM requests need it on FSx clients), in the array LFS; fails with
# the fix when DIR is not on a Lustre file system.
require_lfs() {
  local dir=$1
  if ! command -v lfs >/dev/null 2>&1; then
    log "error: 'lfs' not found: run this on a cluster node with the FSx for Lustre client"
    exit 2
  fi
  if [ ! -d "$dir" ] || ! lfs getstripe -q "$dir" >/dev/null 2>&1; then
    log "error: $dir is not a directory on Lustre; pass an FSx directory (e.g. $SCDINO_DATA_DIR)"
    exit 2
  fi
  LFS=(lfs)
  [ "$(id -u)" -eq 0 ] || LFS=(sudo -n lfs)
}

# Waits until no HSM request is pending under DIR (hsm_action reports NOOP for idle files).
wait_hsm_idle() {
  local dir=$1 busy
  while :; do
    busy=$(find "$dir" -type f -print0 | xargs -0 -r "${LFS[@]}" hsm_action | grep -vc 'NOOP' || true)
    ((busy == 0)) && return 0
    log "$busy file(s) still loading"
    sleep 30
  done
}

# Self-healing launch (in-job restarts, requeue after a transient failure, no retry of a
# deterministic one): run_healing, in its own file.
# shellcheck source=slurm/heal.sh
source "$(dirname "${BASH_SOURCE[0]}")/heal.sh"

# The one thing that runs when this file is sourced: every job script sources it at its start.
record_bundle

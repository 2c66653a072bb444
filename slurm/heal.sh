# shellcheck shell=bash
# Self-healing launch of pretraining; sourced by slurm/lib.sh (it uses log, run_path,
# run_preemptible and requeue_self from there). docs/slurm.md, "Recovery", tells the whole story.
#
# How a failure is retried, and why this way:
#  - In-job restarts by torchrun's elastic agent, up to SCDINO_MAX_RESTARTS (default 3) per job
#    attempt. A worker that dies (signal, OOM, CUDA/NCCL error) or hangs (the progress watchdog ends
#    it with status 76) makes every agent stop its workers and start them again on the same nodes:
#    seconds, not the minutes of a requeue (credential expiry, scheduling, possibly booting nodes),
#    and the allocation is kept. Training resumes from checkpoint.pth, at most
#    train.checkpoint_every_minutes behind.
#  - A self-requeue (scontrol requeue) only when the launch as a whole failed with a transient
#    failure (the restarts are used up, or an agent itself died), up to SCDINO_MAX_REQUEUES (default
#    1) per job: a new allocation can leave a bad node behind. Slurm's own requeue of a job that
#    lost a node (NODE_FAIL, thanks to --requeue) and the pre-emption requeue are unchanged.
#  - Nothing is retried after a deterministic failure (bad config, missing data, a diverged loss):
#    training leaves a marker, workers that torchrun restarts stop at once, and the job exits 2.
# The decision and the closing lines (one per failure: rank, host, what happened, where training
# resumed, restart count) come from the package: python -m training.recovery.policy.

# Worker-group restarts within one job attempt (torchrun --max-restarts).
SCDINO_MAX_RESTARTS=${SCDINO_MAX_RESTARTS:-3}
# Requeues of the job after a transient failure that outlived the in-job restarts.
SCDINO_MAX_REQUEUES=${SCDINO_MAX_REQUEUES:-1}

# Refuses a restart budget that is not a whole number, naming the setting.
heal_check_settings() {
  local name
  for name in SCDINO_MAX_RESTARTS SCDINO_MAX_REQUEUES; do
    if ! [[ ${!name} =~ ^[0-9]+$ ]]; then
      log "error: $name must be a whole number >= 0 (0 turns it off), got '${!name}'"
      return 2
    fi
  done
}

# run_healing CONFIG [--set key=value ...] -- LAUNCH...
# Runs LAUNCH (e.g. torchrun_all_nodes -m training pretrain ...) under the pre-emption protocol
# with torchrun's in-job restarts, then asks the package what to do with how it ended: return 0
# (done), requeue the job, return 2 (deterministic failure) or return the launch's status.
run_healing() {
  local config_args=() rc=0 decision paths preempted failure_log failure_marker
  while (($#)) && [ "$1" != -- ]; do
    config_args+=("$1")
    shift
  done
  if (($# < 2)); then
    log "error: usage: run_healing CONFIG [--set key=value ...] -- LAUNCH..."
    return 2
  fi
  shift
  heal_check_settings || return 2
  paths=$(run_path preempted_marker,failure_log,failure_marker "${config_args[@]}") || return 2
  { read -r preempted; read -r failure_log; read -r failure_marker; } <<<"$paths"
  # torchrun takes any option it was not given from PET_<OPTION>; srun passes it to every agent.
  export PET_MAX_RESTARTS=$SCDINO_MAX_RESTARTS
  # By default the workers' process group shares the rendezvous TCP store, which keeps the previous
  # incarnation's keys: a restarted group then dials dead peers and every restart fails (measured
  # with gloo; pytorch/pytorch#135712 for NCCL). A store per rendezvous round avoids that.
  export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}
  log "self-healing: up to $SCDINO_MAX_RESTARTS in-job restart(s), $SCDINO_MAX_REQUEUES requeue(s) after a failure"
  run_preemptible "$preempted" "$@" || rc=$?
  decision=$("$SCDINO_PYTHON" -m training.recovery.policy --failure-log "$failure_log" \
    --failure-marker "$failure_marker" --exit-code "$rc" --max-requeues "$SCDINO_MAX_REQUEUES") || {
    log "error: could not decide how to go on after status $rc; not retrying"
    return $((rc ? rc : 1))
  }
  heal_act "$decision" "$rc"
}

# Carries out the package's decision (done, requeue, not-retried, stop) for a launch that ended with RC.
heal_act() {
  local decision=$1 rc=$2
  case $decision in
    done) return 0 ;;
    requeue)
      log "transient failure (status $rc): requeueing, attempt $((${SLURM_RESTART_COUNT:-0} + 2)) resumes from the last checkpoint"
      requeue_self || return "$rc"
      return "$rc"
      ;;
    not-retried)
      log "deterministic failure: not retried (the lines above say what to fix)"
      return 2
      ;;
    *)
      log "failed with status $rc after every restart allowed; not retried"
      return "$rc"
      ;;
  esac
}

#!/bin/bash
# Submits the scDINO pipeline as a chain of Slurm jobs, each starting only when the previous one
# succeeded (--dependency=afterok), and prints "STEP JOBID" per line.
#
#   slurm/submit_pipeline.sh CONFIG [options] [--set key=value ...]
#     --from STEP     start at STEP (its inputs must exist in the run directory), e.g. --from features
#     --to STEP       stop after STEP
#     --nodes N       pretraining nodes (default: pretrain.slurm's --nodes)
#     --preset NAME   run on the partition of preset NAME (its instance type, e.g. p4d.24xlarge, or its
#                     partition) with its GPUs and CPUs; default: the cluster's default partition, its
#                     first preset (the site file slurm/env.sh reads names them)
#     --after JOBID[:JOBID...]  the first jobs also wait for these jobs (e.g. a data staging job)
#     --prepare-tasks N  prepare as a Slurm array of N tasks, then one merge job (default 1: one job)
#     --ingest-tasks N   ingest as a Slurm array of N tasks of SCDINO_INGEST_CPUS_PER_TASK CPUs, then
#                     one merge job (default 1: one job); what a task and the merge do: each step's
#                     module docstring (training/steps/prepare.py, training/steps/ingest.py)
#     --profile MODEL  embed the config's screen with a trained model (its run directory, or a checkpoint
#                     file) instead of training one: profile-setup (the model's card against the screen),
#                     ingest, mean-std, profile-check (the screen's statistics), features, labels, knn,
#                     export (training/steps/profile.py); --ingest-tasks applies, --to knn stops earlier
#     --dry-run       print the sbatch commands instead of submitting
#   --set overrides go to every step, so all steps read the same configuration.
# Steps: prepare mean-std pretrain features labels knn linear export plots report; when the config sets
# ingest.table (a screen's load table), ingest takes prepare's place.
# Logs: $SCDINO_LOG_DIR/<job name>_<job id>.out (default logs/ in the current directory).
# If a step fails, Slurm cancels the steps after it (--kill-on-invalid-dep).
# With data.channel_combinations: prepare and mean-std once (skipped when their files exist), then
# one chain pretrain..report per combination ("STEP:COMBINATION JOBID"; a combination whose report
# exists is finished and skipped), then `compare` after all chains (when --to is report).
# With data.compare_channel_adaptive as well, for each KIND of data.channel_adaptive_kinds: one
# channel-adaptive pretraining ("pretrain:adaptive-KIND") after mean-std, then per combination its
# evaluation features..linear ("STEP:adaptive-KIND-COMBINATION"; one whose linear probe exists is
# skipped, and the pretraining too when all are), before `compare`.
# The chain is computed by the package (`python -m training chain`, training/chain/graph.py), with
# $SCDINO_PYTHON, else the venv beside this script's bundle; this script submits it in order.
set -euo pipefail

# The folder itself, not through the /apps/scdino link: the jobs use this bundle's scripts.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
BUNDLE=$(dirname "$HERE")

# This file's leading comment, whole: the help.
help_text() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "${BASH_SOURCE[0]}"; }

usage() {
  help_text >&2
  exit 2
}

fail() {
  echo "submit_pipeline: error: $*" >&2
  exit 2
}

CONFIG=""
DRY_RUN=0
PRESET=""
# The planner's options (python -m training chain), as given; it checks them and the config.
PLAN_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --from) PLAN_ARGS+=(--from "${2:?--from needs a step}"); shift 2 ;;
    --to) PLAN_ARGS+=(--to "${2:?--to needs a step}"); shift 2 ;;
    --nodes) PLAN_ARGS+=(--nodes "${2:?--nodes needs a number}"); shift 2 ;;
    --after) PLAN_ARGS+=(--after "${2:?--after needs a job id}"); shift 2 ;;
    --preset) PRESET=${2:?--preset needs a preset name, e.g. p4d.24xlarge}; shift 2 ;;
    --prepare-tasks) PLAN_ARGS+=(--prepare-tasks "${2:?--prepare-tasks needs a number}"); shift 2 ;;
    --ingest-tasks) PLAN_ARGS+=(--ingest-tasks "${2:?--ingest-tasks needs a number}"); shift 2 ;;
    --profile) PLAN_ARGS+=(--profile "${2:?--profile needs a trained run directory or checkpoint}"); shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --set) PLAN_ARGS+=(--set "${2:?--set needs key=value}"); shift 2 ;;
    -h | --help) help_text; exit 0 ;;
    -*) fail "unknown option $1 (see --help)" ;;
    *) [ -z "$CONFIG" ] || fail "one CONFIG only, got '$CONFIG' and '$1'"; CONFIG=$1; shift ;;
  esac
done
[ -n "$CONFIG" ] || usage
[ -f "$CONFIG" ] || fail "config file not found: $CONFIG"

# The site settings; --preset picks the preset whose shape they take (over the environment's).
if [ -n "$PRESET" ]; then
  SCDINO_PRESET=$PRESET
  unset SCDINO_PARTITION SCDINO_GPUS_PER_NODE SCDINO_CPUS_PER_GPU SCDINO_INSTANCE_TYPE
fi
# shellcheck source=slurm/env.sh
source "$HERE/env.sh"
if [ -n "$PRESET" ]; then
  [ -n "$SCDINO_CLUSTER_PRESETS" ] || fail "--preset $PRESET: no cluster site file at $SCDINO_CLUSTER_ENV (the node \
bootstrap writes it); set SCDINO_PARTITION, SCDINO_GPUS_PER_NODE and SCDINO_CPUS_PER_GPU instead"
  read -r shape_type shape_queue _ <<<"$SCDINO_SHAPE"
  [ "$PRESET" = "$shape_type" ] || [ "$PRESET" = "$shape_queue" ] || fail "this cluster has no preset '$PRESET'; \
its presets: $(awk '{printf "%s%s (partition %s)", sep, $1, $2; sep = ", "}' <<<"$SCDINO_CLUSTER_PRESETS")"
fi

LOG_DIR=${SCDINO_LOG_DIR:-logs}
if ! mkdir -p "$LOG_DIR" 2>/dev/null || [ ! -w "$LOG_DIR" ]; then
  fail "cannot write the log folder '$LOG_DIR' from $(pwd): submit from a folder of your own (on a cluster \
/fsx/data/work/\$USER) or set SCDINO_LOG_DIR"
fi

# The package plans the chain: with the jobs' Python, else the venv of this script's bundle (a checkout's).
PLANNER=$SCDINO_PYTHON
[ -x "$PLANNER" ] || PLANNER=$BUNDLE/.venv/bin/python
[ -x "$PLANNER" ] || fail "no Python at $SCDINO_PYTHON or $PLANNER to plan the chain with: set SCDINO_VENV \
(slurm/env.sh) to the venv that has the training bundle"

# The chain, planned before anything is submitted: per job its label, the count of sbatch's arguments and
# the arguments, each ending in NUL; "<LABEL>" in a --dependency stands for that earlier job's id.
PLAN=$(mktemp)
PLAN_ERRORS=$(mktemp)
trap 'rm -f "$PLAN" "$PLAN_ERRORS"' EXIT
if ! PYTHONPATH=$BUNDLE${PYTHONPATH:+:$PYTHONPATH} "$PLANNER" -m training chain --config "$CONFIG" "${PLAN_ARGS[@]}" \
  --partition "$SCDINO_PARTITION" --cpus-per-task "$SCDINO_CPUS_PER_TASK" \
  --ingest-cpus-per-task "$SCDINO_INGEST_CPUS_PER_TASK" --output="$LOG_DIR/%x_%j.out" --bundle "$BUNDLE" \
  --comment="${SCDINO_BUNDLE_MARK:-}" --format nul >"$PLAN" 2>"$PLAN_ERRORS"; then
  error=$(tail -n 1 "$PLAN_ERRORS")
  [[ "$error" == "error: "* ]] || { cat "$PLAN_ERRORS" >&2; fail "planning the chain failed (see above)"; }
  head -n -1 "$PLAN_ERRORS" >&2
  fail "${error#error: }"
fi
cat "$PLAN_ERRORS" >&2
((DRY_RUN)) || [ -x "$SCDINO_PYTHON" ] || fail "no Python at $SCDINO_PYTHON, which the jobs run: set SCDINO_VENV \
(slurm/env.sh) to the venv that has the training bundle"
# Jobs find env.sh and lib.sh here, whatever directory they are submitted from.
export SCDINO_SLURM_DIR=$HERE

# The bundle every job runs (slurm/env.sh resolved /apps/scdino to it): each job gets it in SCDINO_HOME,
# requeued too, and the planner names it in every job's comment (--comment above), so that a code update
# keeps it while a job is pending or running (bootstrap/on-node-configured.sh asks squeue).
# SCDINO_JOB_COMMENT tells the job (slurm/lib.sh) that its comment has the mark already.
export SCDINO_HOME
if [ -n "${SCDINO_BUNDLE_MARK:-}" ]; then
  export SCDINO_JOB_COMMENT=$SCDINO_BUNDLE_MARK
fi

declare -A JOB_IDS=()

# ARG with each "<LABEL>" replaced by the id of the job submitted as LABEL.
with_job_ids() {
  local arg=$1 label
  while [[ "$arg" =~ \<([^<>]+)\> ]]; do
    label=${BASH_REMATCH[1]}
    [ -n "${JOB_IDS[$label]:-}" ] || fail "internal: '$label' is waited for before it was submitted"
    arg=${arg//"<$label>"/${JOB_IDS[$label]}}
  done
  echo "$arg"
}

# `sbatch ARGS...` for the job called LABEL: prints "LABEL JOBID"; under --dry-run prints the command
# instead, the jobs it waits for as "<LABEL>".
submit() {
  local label=$1 arg args=() id
  shift
  if ((DRY_RUN)); then
    echo "sbatch $*"
    return 0
  fi
  for arg in "$@"; do
    [[ "$arg" != --dependency=* ]] || arg=$(with_job_ids "$arg")
    args+=("$arg")
  done
  id=$(sbatch "${args[@]}")
  JOB_IDS[$label]=${id%%;*}
  echo "$label ${JOB_IDS[$label]}"
}

mapfile -d '' -t FIELDS <"$PLAN"
i=0
while ((i < ${#FIELDS[@]})); do
  label=${FIELDS[i]} words=${FIELDS[i + 1]}
  submit "$label" "${FIELDS[@]:i+2:words}"
  i=$((i + 2 + words))
done

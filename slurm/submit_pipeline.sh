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
#     --after JOBID   the first job also waits for JOBID (e.g. a data staging job)
#     --prepare-tasks N  prepare as a Slurm array of N tasks (each packs a slice of the images,
#                     in parallel across nodes), then one merge job (default 1: one job)
#     --ingest-tasks N   ingest as a Slurm array of N tasks of SCDINO_INGEST_CPUS_PER_TASK CPUs (each
#                     cuts the cells of a slice of the fields), then one merge job (default 1: one job)
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
set -euo pipefail

STEPS=(prepare mean-std pretrain features labels knn linear export plots report)
# Steps every channel combination shares, with the run file that shows each is done.
declare -A SHARED_OUTPUT=([prepare]=split [ingest]=split [mean-std]=mean_std)
# Steps that start their own processes on whole nodes; the others run one process on a CPU share.
MULTI_NODE=" pretrain features "
# Steps that evaluate the channel-adaptive model on one combination: no plots or report, whose
# attention maps take no channel subset of a channel-adaptive checkpoint.
EVALUATION=" features labels knn linear "

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

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

step_index() {
  local i
  for i in "${!STEPS[@]}"; do
    [ "${STEPS[$i]}" = "$1" ] && { echo "$i"; return 0; }
  done
  fail "unknown step '$1'; steps: ${STEPS[*]}"
}

CONFIG=""
FROM=""
TO=report
NODES=""
AFTER=""
PRESET=""
PREPARE_TASKS=1
INGEST_TASKS=1
DRY_RUN=0
STEP_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --from) FROM=${2:?--from needs a step}; shift 2 ;;
    --to) TO=${2:?--to needs a step}; shift 2 ;;
    --nodes) NODES=${2:?--nodes needs a number}; shift 2 ;;
    --after) AFTER=${2:?--after needs a job id}; shift 2 ;;
    --preset) PRESET=${2:?--preset needs a preset name, e.g. p4d.24xlarge}; shift 2 ;;
    --prepare-tasks) PREPARE_TASKS=${2:?--prepare-tasks needs a number}; shift 2 ;;
    --ingest-tasks) INGEST_TASKS=${2:?--ingest-tasks needs a number}; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --set) STEP_ARGS+=(--set "${2:?--set needs key=value}"); shift 2 ;;
    -h | --help) help_text; exit 0 ;;
    -*) fail "unknown option $1 (see --help)" ;;
    *) [ -z "$CONFIG" ] || fail "one CONFIG only, got '$CONFIG' and '$1'"; CONFIG=$1; shift ;;
  esac
done
[ -n "$CONFIG" ] || usage
[ -f "$CONFIG" ] || fail "config file not found: $CONFIG"
[ -z "$NODES" ] || [[ "$NODES" =~ ^[1-9][0-9]*$ ]] || fail "--nodes must be a positive integer, got '$NODES'"
[[ "$PREPARE_TASKS" =~ ^[1-9][0-9]*$ ]] || fail "--prepare-tasks must be a positive integer, got '$PREPARE_TASKS'"
[[ "$INGEST_TASKS" =~ ^[1-9][0-9]*$ ]] || fail "--ingest-tasks must be a positive integer, got '$INGEST_TASKS'"

# The site settings; --preset picks the preset whose shape they take (over the environment's).
if [ -n "$PRESET" ]; then
  SCDINO_PRESET=$PRESET
  unset SCDINO_PARTITION SCDINO_GPUS_PER_NODE SCDINO_CPUS_PER_GPU SCDINO_INSTANCE_TYPE
fi
# shellcheck source=slurm/env.sh
source "$HERE/env.sh"
# shellcheck source=slurm/lib.sh
source "$HERE/lib.sh"
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
# Jobs find env.sh and lib.sh here, whatever directory they are submitted from.
export SCDINO_SLURM_DIR=$HERE
COMBINATIONS=() ADAPTIVE_COMBINATIONS=() ADAPTIVE_KINDS=()
if [ -x "$SCDINO_PYTHON" ]; then
  # Checks the config (and --set keys) now, rather than in the first job.
  RUN_DIR=$(run_dir "$CONFIG" "${STEP_ARGS[@]}") || fail "bad configuration (see above)"
  echo "run directory: $RUN_DIR" >&2
  mapfile -t COMBINATIONS < <(run_combinations "$CONFIG" "${STEP_ARGS[@]}")
  if ((${#COMBINATIONS[@]})); then
    mapfile -t ADAPTIVE_COMBINATIONS < <(run_adaptive_combinations "$CONFIG" "${STEP_ARGS[@]}")
    mapfile -t ADAPTIVE_KINDS < <(run_adaptive_kinds "$CONFIG" "${STEP_ARGS[@]}")
  fi
  # A screen's load table: the chain starts by cutting its cells out of the fields of view.
  [ -z "$(run_path --ingest-table "$CONFIG" "${STEP_ARGS[@]}")" ] || STEPS[0]=ingest
else
  echo "note: no Python at $SCDINO_PYTHON: config not checked, data.channel_combinations not read" >&2
fi
FIRST=$(step_index "${FROM:-${STEPS[0]}}")
LAST=$(step_index "$TO")
((FIRST <= LAST)) || fail "--from $FROM comes after --to $TO"

# sbatch options of one step: site settings from env.sh override the scripts' #SBATCH defaults.
step_options() {
  local step=$1 options=(--parsable --partition="$SCDINO_PARTITION" --output="$LOG_DIR/%x_%j.out")
  if [[ "$MULTI_NODE" == *" $step "* ]]; then
    [ "$step" = pretrain ] && [ -n "$NODES" ] && options+=(--nodes="$NODES")
  elif [ "$step" = ingest ]; then
    options+=(--cpus-per-task="$SCDINO_INGEST_CPUS_PER_TASK")
  else
    options+=(--cpus-per-task="$SCDINO_CPUS_PER_TASK")
  fi
  printf '%s\n' "${options[@]}"
}

# Submits STEP after job AFTER (may be empty) with extra step arguments and prints "LABEL JOBID";
# under --dry-run prints the sbatch command instead and uses "<LABEL>" as the job id. Leaves the
# job id in JOB_ID. A combination's jobs are named scdino-STEP-COMBINATION, a channel-adaptive
# model's scdino-STEP-adaptive-KIND and scdino-STEP-adaptive-KIND-COMBINATION.
submit() {
  local step=$1 after=$2 label=$3 options
  shift 3
  if [ "$step" = prepare ] && ((PREPARE_TASKS > 1)); then
    submit_parts prepare "$PREPARE_TASKS" "$after" --exclusive -- "$@"
    return 0
  fi
  if [ "$step" = ingest ] && ((INGEST_TASKS > 1)); then
    submit_parts ingest "$INGEST_TASKS" "$after" -- "$@"
    return 0
  fi
  mapfile -t options < <(step_options "$step")
  [ "$label" = "$step" ] || options+=(--job-name="scdino-${label/:/-}")
  [ -z "$after" ] || options+=(--dependency="afterok:$after" --kill-on-invalid-dep=yes)
  run_sbatch "$label" "${options[@]}" "$HERE/$step.slurm" "$CONFIG" "${STEP_ARGS[@]}" "$@"
}

# `sbatch ARGS...` for the job called LABEL: prints "LABEL JOBID" and leaves the id in JOB_ID; under
# --dry-run prints the command instead and uses "<LABEL>" as the id.
run_sbatch() {
  local label=$1
  shift
  if ((DRY_RUN)); then
    echo "sbatch $*"
    JOB_ID="<$label>"
    return 0
  fi
  JOB_ID=$(sbatch "$@")
  JOB_ID=${JOB_ID%%;*}
  echo "$label $JOB_ID"
}

# STEP (prepare or ingest) as an array of TASKS tasks after job AFTER, then its merge: prints
# "STEP-parts JOBID" and "STEP JOBID", and leaves the merge's id in JOB_ID. The sbatch options
# before "--" go to the array only: prepare's tasks take --exclusive, one task per node, each with
# the node's cores and its own link to FSx (decoding and reading are what a part spends its time
# on); ingest's tasks crop on one core each, so Slurm packs several onto a node.
submit_parts() {
  local step=$1 tasks=$2 after=$3 options array_options=()
  shift 3
  while (($#)) && [ "$1" != -- ]; do
    array_options+=("$1")
    shift
  done
  shift
  mapfile -t options < <(step_options "$step")
  options+=(--job-name="scdino-$step-parts" --array="0-$((tasks - 1))" "${array_options[@]}")
  [ -z "$after" ] || options+=(--dependency="afterok:$after" --kill-on-invalid-dep=yes)
  run_sbatch "$step-parts" "${options[@]}" "$HERE/$step.slurm" "$CONFIG" "${STEP_ARGS[@]}" "$@" --parts "$tasks"
  mapfile -t options < <(step_options "$step")
  options+=(--dependency="afterok:$JOB_ID" --kill-on-invalid-dep=yes)
  run_sbatch "$step" "${options[@]}" "$HERE/$step.slurm" "$CONFIG" "${STEP_ARGS[@]}" "$@" --merge --parts "$tasks"
}

# The --set arguments that pick one run by the name its job labels carry, one a line: "" the run
# itself, COMBINATION that combination's own run, "adaptive-KIND" the channel-adaptive model of KIND
# (kinds have no hyphen), "adaptive-KIND-COMBINATION" that model evaluated on COMBINATION.
run_selector() {
  local rest
  case "$1" in
    "") ;;
    adaptive-*-*)
      rest=${1#adaptive-}
      printf '%s\n' --set "run.channel_adaptive=${rest%%-*}" --set "run.combination=${rest#*-}" ;;
    adaptive-*) printf '%s\n' --set "run.channel_adaptive=${1#adaptive-}" ;;
    *) printf '%s\n' --set "run.combination=$1" ;;
  esac
}

# Path NAME (training/rundir/layout.py) of the run called RUN (as in run_selector).
path_of() {
  local selector
  mapfile -t selector < <(run_selector "$2")
  run_path "$1" "$CONFIG" "${STEP_ARGS[@]}" "${selector[@]}"
}

# Submits STEPS... as an afterok chain after job AFTER, in the run called RUN (run_selector; empty:
# the run itself), labelled STEP:RUN; leaves the last job id (else AFTER) in CHAIN_END.
submit_chain() {
  local after=$1 run=$2 step label extra
  shift 2
  mapfile -t extra < <(run_selector "$run")
  for step in "$@"; do
    label=$step
    [ -z "$run" ] || label=$step:$run
    submit "$step" "$after" "$label" "${extra[@]}"
    after=$JOB_ID
  done
  CHAIN_END=$after
}

# The channel-adaptive model of KIND after job AFTER, given the selected per-combination steps
# STEPS...: its pretraining if among them, then for each combination not yet evaluated the EVALUATION
# steps among them; adds each evaluation's last job id to ENDS. Nothing once every combination is
# evaluated.
submit_channel_adaptive() {
  local kind=$1 after=$2 step combination steps=() pending=()
  shift 2
  for combination in "${ADAPTIVE_COMBINATIONS[@]}"; do
    if [ -e "$(path_of linear_json "adaptive-$kind-$combination")" ]; then
      echo "channel-adaptive $kind model on $combination: evaluated (its linear probe exists), skipped" >&2
    else
      pending+=("$combination")
    fi
  done
  ((${#pending[@]})) || return 0
  for step in "$@"; do
    [[ "$EVALUATION" == *" $step "* ]] && steps+=("$step")
  done
  if [[ " $* " == *" pretrain "* ]]; then
    submit_chain "$after" "adaptive-$kind" pretrain
    after=$CHAIN_END
  fi
  ((${#steps[@]})) || return 0
  for combination in "${pending[@]}"; do
    submit_chain "$after" "adaptive-$kind-$combination" "${steps[@]}"
    [ -z "$CHAIN_END" ] || ENDS+=("$CHAIN_END")
  done
}

CHAIN_END=""
SELECTED=("${STEPS[@]:FIRST:LAST-FIRST+1}")
if ((${#COMBINATIONS[@]} == 0)); then
  submit_chain "$AFTER" "" "${SELECTED[@]}"
  exit 0
fi

# Channel combinations: the shared steps once, unless their files are there already.
shared=() per_combination=()
for step in "${SELECTED[@]}"; do
  if [ -z "${SHARED_OUTPUT[$step]:-}" ]; then
    per_combination+=("$step")
  elif [ -e "$(run_path "${SHARED_OUTPUT[$step]}" "$CONFIG" "${STEP_ARGS[@]}")" ]; then
    echo "$step: skipped, its output is there" >&2
  else
    shared+=("$step")
  fi
done
submit_chain "$AFTER" "" "${shared[@]}"
shared_end=${CHAIN_END:-$AFTER}
ENDS=()
for combination in "${COMBINATIONS[@]}"; do
  if [ -e "$(path_of report "$combination")" ]; then
    echo "channels $combination: finished (its report exists), skipped" >&2
    continue
  fi
  submit_chain "$shared_end" "$combination" "${per_combination[@]}"
  [ -z "$CHAIN_END" ] || ENDS+=("$CHAIN_END")
done
if ((${#ADAPTIVE_COMBINATIONS[@]})); then
  for kind in "${ADAPTIVE_KINDS[@]}"; do
    submit_channel_adaptive "$kind" "$shared_end" "${per_combination[@]}"
  done
fi
if [ "$TO" = report ]; then
  dependency=$(IFS=:; echo "${ENDS[*]}")
  submit compare "${dependency:-$shared_end}" compare
fi

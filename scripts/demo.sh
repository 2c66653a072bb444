#!/usr/bin/env bash
# The body of `make demo`: the whole scDINO pipeline on the embedded synthetic dataset, submitted
# with the same slurm/*.slurm scripts as on AWS, to a real Slurm cluster on this machine (CPU).
#   1. generate the synthetic dataset (python -m training synth-data), unless it exists
#   2. start the local Slurm cluster (scripts/local-slurm.sh start)
#   3. submit the chain (slurm/submit_pipeline.sh) and follow it: job states and log tails
#   4. write runs/demo/results.json (kNN of the trained model and baselines, time of each step),
#      print the kNN table and the report's path
#   5. synthesise the CDK app (`npx cdk synth`), listing what `cdk deploy` would create
# A second run reuses the dataset, the cluster and a finished run (DEMO_FORCE=1 reruns the chain).
# Settings: DEMO_CONFIG (configs/demo.yaml), DEMO_PER_CLASS (400), DEMO_FORCE, and
# scripts/local-slurm.sh's SLURM_LOCAL_*.
set -Eeuo pipefail

# The last line of a log that has been written whole, for the live view. A progress bar (tqdm)
# redraws itself by writing "\r" and its new state, so a state, like a line, is whole only once
# the next "\r" or "\n" follows it: what comes after the last one may be half-written, and so may
# the first piece of a window cut from the end of a long log. Prints nothing when no line is whole.
last_complete_line() {
  local file=$1 window=${2:-4000} text
  [ -r "$file" ] || return 0
  text=$(tail -c "$window" "$file" | tr -d '\000' | tr '\r' '\n'; echo x)  # x keeps the trailing line ends
  text=${text%x}
  [[ $text == *$'\n'* ]] || return 0
  text=${text%$'\n'*}
  if (($(wc -c <"$file") > window)); then  # measured after reading: a log only grows
    [[ $text == *$'\n'* ]] || return 0
    text=${text#*$'\n'}
  fi
  printf '%s\n' "$text" | grep -av '^[[:space:]]*$' | tail -n 1 || true
}

# States of a job that has not ended (squeue's JOB STATE CODES): the chain is still going. The one list
# that combined_state, follow and live_chain read.
LIVE_STATES=" PENDING CONFIGURING RUNNING COMPLETING REQUEUED REQUEUE_HOLD REQUEUE_FED RESIZING SUSPENDED STAGE_OUT SIGNALING "
is_live() { [[ -n "$1" && "$LIVE_STATES" == *" $1 "* ]]; }

# A job's state, whichever of Slurm's sources still knows it: the controller holds a job until
# MinJobAge after its end (600 s on the local cluster, 300 s by default), then only the job completion
# log (jobcomp/filetxt, the local cluster: `sacct --completion`) or accounting (slurmdbd: `sacct`)
# does. An array's state is its tasks': the first failure among them, else one still to run, else
# COMPLETED. Prints nothing when no source knows the job, and never fails: a slow or busy
# controller is a question for the next poll, not the end of the script.
job_state() {
  local id=$1 out source
  if out=$(scontrol show job -o "$id" 2>/dev/null) && [ -n "$out" ]; then
    sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$out" | combined_state
    return 0
  fi
  # Accounting is asked only when the completion log does not know the job.
  for source in --completion -X; do
    out=$(sacct "$source" -n -P -j "$id" --format=JobID,State 2>/dev/null) || continue
    out=$(awk -F'|' -v id="$id" '$1 == id || index($1, id "_") == 1 {split($2, s, " "); print s[1]}' <<<"$out")
    if [ -n "$out" ]; then
      combined_state <<<"$out"
      return 0
    fi
  done
}

# One state for the states of a job's tasks, one a line (a plain job has one).
combined_state() {
  awk -v live_states="$LIVE_STATES" 'NF {n++; if ($1 == "COMPLETED") done++; else if (index(live_states, " " $1 " ")) live = $1; else if (bad == "") bad = $1}
       END {if (bad != "") print bad; else if (live != "") print live; else if (n && done == n) print "COMPLETED"}'
}

# One line for an error the demo found itself; the exit trap (when running) knows it has been said.
die() {
  echo "demo: error: $*" >&2
  REPORTED=1
  exit 1
}

# Arguments: "STEP JOBID" lines. Prints a line whenever a job changes state, and the last log line
# of the running job; returns at the end of the chain, stops at the first job that did not complete
# or that no Slurm source has known for DEMO_UNKNOWN_SECONDS (120) seconds.
follow() {
  local last="" last_tail="" tail_line line running state entry step id all_done
  local -A unknown_since=() completed=()
  local limit=${DEMO_UNKNOWN_SECONDS:-120}
  while :; do
    line="" running="" all_done=1
    for entry in "$@"; do
      step=${entry% *} id=${entry#* }
      # A completed job stays so: it is not asked again at every poll.
      state=${completed[$id]:-$(job_state "$id")}
      case "$state" in
        COMPLETED) line+="$step:done " ;;
        RUNNING) line+="$step:RUNNING " ;;
        PENDING) line+="$step:- " ;;
        *) line+="$step:${state:-?} " ;;
      esac
      if [ "$state" = COMPLETED ]; then
        unset "unknown_since[$id]"
        completed[$id]=COMPLETED
      elif is_live "$state"; then
        unset "unknown_since[$id]"
        all_done=0
      elif [ -z "$state" ]; then
        all_done=0
        : "${unknown_since[$id]:=$SECONDS}"
        if ((SECONDS - unknown_since[$id] >= limit)); then
          printf '%s\n' "$line"
          lost_job "$step" "$id" "$limit"
        fi
      else
        printf '%s\n' "$line"
        show_failure "$step" "$id" "$state"
      fi
      if [ "$state" = RUNNING ] && [ -z "$running" ]; then running=$entry; fi
    done
    if [ "$line" != "$last" ]; then
      printf '[%4ds] %s\n' $((SECONDS - ${START:-0})) "$line"
      last=$line
    fi
    if [ -n "$running" ]; then
      PHASE="following step ${running% *} (job ${running#* }, log $(job_log "${running% *}" "${running#* }"))"
      tail_line=$(last_complete_line "$(job_log "${running% *}" "${running#* }")")
      # Whole lines; a very long one is shortened visibly (characters, not bytes: bars are UTF-8).
      ((${#tail_line} <= 200)) || tail_line="${tail_line:0:199}…"
      if [ -n "$tail_line" ] && [ "$tail_line" != "$last_tail" ]; then
        echo "         | $tail_line"
        last_tail=$tail_line
      fi
    fi
    ((all_done)) && return 0
    sleep 3
  done
}

job_log() { echo "$LOG_DIR/scdino-$1_$2.out"; }

show_failure() {
  local step=$1 id=$2 state=$3 log
  log=$(job_log "$step" "$id")
  echo "demo: step $step (job $id) ended $state; the end of its log ($log):" >&2
  tail -n 30 "$log" >&2 || echo "  (no log at $log)" >&2
  REPORTED=1
  exit 1
}

lost_job() {
  local step=$1 id=$2 limit=$3
  die "no Slurm source has known step $step (job $id) for $limit s: not the controller (scontrol), \
the job completion log (sacct --completion) or accounting (sacct). Is the cluster up? scripts/local-slurm.sh status; \
its log: $(job_log "$step" "$id")"
}

# Sourced (tests/slurm/test_demo_log_tail.py, test_demo_follow.py): only define the functions above.
if [[ ${BASH_SOURCE[0]} != "$0" ]]; then return 0; fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
CONFIG=${DEMO_CONFIG:-configs/demo.yaml}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
FORCE=${DEMO_FORCE:-0}
# 400 images per class: 1000 held out (800 kNN references, 200 queries) with configs/demo.yaml.
PER_CLASS=${DEMO_PER_CLASS:-400}
PIPELINE_RAN=0
START=$SECONDS
PHASE="starting"
JOBS=()      # "STEP JOBID" of the chain this run follows: cancelled if the demo stops before its end
REPORTED=0   # 1 once the reason of a stop has been printed

say() { printf '\n== %s\n' "$*"; }

# Every stop says where and why: an error names the command and the phase, and jobs left behind
# are cancelled (they would go on writing into the run folder, and hold the nodes the next command
# needs), unless DEMO_KEEP_JOBS=1.
on_error() {
  local rc=$1 line=$2 command=$3
  # A failure inside $(...) is reported once, by the command that used it.
  ((REPORTED || BASH_SUBSHELL)) && return 0
  REPORTED=1
  echo "demo: error: \`$command\` failed (exit $rc, scripts/demo.sh line $line) while $PHASE" >&2
}
on_exit() {
  local rc=$? ids
  if ((rc != 0)); then
    ((REPORTED)) || echo "demo: stopped (exit $rc) while $PHASE" >&2
    if ((${#JOBS[@]})) && [ "${DEMO_KEEP_JOBS:-0}" != 1 ]; then
      ids=$(printf '%s\n' "${JOBS[@]}" | awk '{print $2}' | paste -sd' ')
      # shellcheck disable=SC2086  # one id a word
      scancel $ids 2>/dev/null || true
      echo "demo: cancelled the chain's jobs ($ids); logs in $LOG_DIR" >&2
    fi
  fi
}
trap 'on_error $? $LINENO "$BASH_COMMAND"' ERR
trap on_exit EXIT
trap 'echo; echo "demo: interrupted" >&2; REPORTED=1; exit 130' INT TERM

[ -x "$PYTHON" ] || die "no virtualenv at $PYTHON: run \`make demo\` (it installs first)"
[ -f "$CONFIG" ] || die "config not found: $CONFIG"
[ "$(id -u)" -eq 0 ] || die "the local Slurm cluster needs root (slurmd, munged, network namespaces): sudo make demo"
PHASE="reading the run's paths from $CONFIG"
# Paths of the run, asked from the package (training/rundir/layout.py owns every file name).
mapfile -t PATHS < <("$PYTHON" -m training paths --config "$CONFIG" root logs report knn_json results)
[ "${#PATHS[@]}" -eq 5 ] || die "cannot read the run paths of $CONFIG (see the error above)"
RUN_DIR=${PATHS[0]}
LOG_DIR=${PATHS[1]}
REPORT=${PATHS[2]}
KNN_JSON=${PATHS[3]}
RESULTS=${PATHS[4]}
DATA_DIR=$("$PYTHON" -c 'import sys; from training.config import load_config; print(load_config(sys.argv[1]).data.source)' "$CONFIG")

make_dataset() {
  PHASE="writing the synthetic dataset"
  if [ -n "$(find "$DATA_DIR" -name '*.tif' -print -quit 2>/dev/null)" ]; then
    say "synthetic dataset: reusing $DATA_DIR ($(find "$DATA_DIR" -name '*.tif' | wc -l) images)"
  else
    say "synthetic dataset -> $DATA_DIR"
    "$PYTHON" -m training synth-data --config "$CONFIG" --per-class "$PER_CLASS"
  fi
}

start_cluster() {
  PHASE="starting the local Slurm cluster (its logs: ${SLURM_LOCAL_BASE:-.local-slurm}/log/)"
  say "local Slurm cluster"
  scripts/local-slurm.sh start
  # shellcheck source=/dev/null
  source "${SLURM_LOCAL_BASE:-$REPO/.local-slurm}/scdino-env.sh"
  sinfo
}

run_finished() {
  [ -s "$REPORT" ] && [ -s "$KNN_JSON" ] && [ "$REPORT" -nt "$CONFIG" ]
}

# The chain an earlier, interrupted call submitted, when some of its jobs are still queued or
# running: following it again beats submitting a second chain into the same run folder.
live_chain() {
  local entry
  [ -s "$LOG_DIR/jobs.txt" ] || return 1
  while read -r entry; do
    if is_live "$(job_state "${entry#* }")"; then return 0; fi
  done <"$LOG_DIR/jobs.txt"
  return 1
}

run_pipeline() {
  if run_finished && [ "$FORCE" != 1 ]; then
    say "pipeline: $RUN_DIR is complete, reusing it (DEMO_FORCE=1 reruns it)"
    return 0
  fi
  if live_chain; then
    mapfile -t JOBS <"$LOG_DIR/jobs.txt"
    say "following the chain an earlier call submitted, still running (logs in $LOG_DIR)"
  else
    PHASE="submitting the pipeline (slurm/submit_pipeline.sh $CONFIG)"
    say "submitting the pipeline (logs in $LOG_DIR)"
    mapfile -t JOBS < <(SCDINO_LOG_DIR=$LOG_DIR slurm/submit_pipeline.sh "$CONFIG")
    [ "${#JOBS[@]}" -gt 0 ] || die "nothing submitted (see slurm/submit_pipeline.sh's error above)"
    printf '%s\n' "${JOBS[@]}" >"$LOG_DIR/jobs.txt"
  fi
  printf '  %s\n' "${JOBS[@]}"
  PIPELINE_RAN=1
  say "following the jobs"
  PHASE="following the jobs"
  follow "${JOBS[@]}"
  JOBS=()
}

# The run summary (results.json): kNN of the trained model and both baselines, each step's time in
# Python and as a Slurm job; job and wall times only when this call ran the pipeline.
write_results() {
  PHASE="writing the run's summary (python -m training summary)"
  say "results"
  local -a args=(--config "$CONFIG")
  ((PIPELINE_RAN)) && args+=(--jobs "$LOG_DIR/jobs.txt" --wall-seconds "$((SECONDS - START))")
  "$PYTHON" -m training summary "${args[@]}"
}

synth_cdk() {
  [ -f app.py ] || { say "CDK app: app.py not present, skipping cdk synth"; return 0; }
  PHASE="synthesising the CDK app"
  say "what \`cdk deploy\` would create (npx cdk synth, offline)"
  if npx --no-install cdk synth --quiet >"$RUN_DIR/logs/cdk-synth.log" 2>&1; then
    "$PYTHON" - <<'PY'
import json
from collections import Counter
from pathlib import Path

for template in sorted(Path("cdk.out").glob("*.template.json")):
    resources = json.loads(template.read_text()).get("Resources", {})
    kinds = Counter(r["Type"] for r in resources.values())
    top = ", ".join(f"{n} {t.split('::')[-1]}" for t, n in kinds.most_common(6))
    print(f"  {template.name.removesuffix('.template.json')}: {len(resources)} resources ({top})")
PY
  else
    echo "  cdk synth failed (the demo itself is unaffected); see $RUN_DIR/logs/cdk-synth.log"
  fi
}

make_dataset
start_cluster
mkdir -p "$LOG_DIR"
run_pipeline
write_results
synth_cdk
say "done in $((SECONDS - START)) s"
echo "results: $RESULTS"
echo "report:  $(cd "$(dirname "$REPORT")" && pwd)/$(basename "$REPORT")"

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
set -euo pipefail

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

# Sourced (tests/slurm/test_demo_log_tail.py): only define the function above.
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

say() { printf '\n== %s\n' "$*"; }
die() { echo "demo: error: $*" >&2; exit 1; }

[ -x "$PYTHON" ] || die "no virtualenv at $PYTHON: run \`make demo\` (it installs first)"
[ -f "$CONFIG" ] || die "config not found: $CONFIG"
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
  if [ -n "$(find "$DATA_DIR" -name '*.tif' -print -quit 2>/dev/null)" ]; then
    say "synthetic dataset: reusing $DATA_DIR ($(find "$DATA_DIR" -name '*.tif' | wc -l) images)"
  else
    say "synthetic dataset -> $DATA_DIR"
    "$PYTHON" -m training synth-data --config "$CONFIG" --per-class "$PER_CLASS"
  fi
}

start_cluster() {
  say "local Slurm cluster"
  scripts/local-slurm.sh start
  # shellcheck source=/dev/null
  source "${SLURM_LOCAL_BASE:-$REPO/.local-slurm}/scdino-env.sh"
  sinfo
}

run_finished() {
  [ -s "$REPORT" ] && [ -s "$KNN_JSON" ] && [ "$REPORT" -nt "$CONFIG" ]
}

job_state() { scontrol show job -o "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }

# Arguments: "STEP JOBID" lines. Prints a line whenever a job changes state, and the last log line
# of the running job; stops at the end of the chain, or at the first job that did not complete.
follow() {
  local last="" last_tail="" tail_line line running state entry step id all_done
  while :; do
    line="" running="" all_done=1
    for entry in "$@"; do
      step=${entry% *} id=${entry#* }
      state=$(job_state "$id")
      case "$state" in
        COMPLETED) line+="$step:done " ;;
        RUNNING) line+="$step:RUNNING " ;;
        PENDING) line+="$step:- " ;;
        *) line+="$step:${state:-?} " ;;
      esac
      case "$state" in
        COMPLETED) ;;
        PENDING | CONFIGURING | RUNNING | COMPLETING | REQUEUED | REQUEUE_HOLD) all_done=0 ;;
        *) printf '%s\n' "$line"; show_failure "$step" "$id" "${state:-unknown}" ;;
      esac
      if [ "$state" = RUNNING ] && [ -z "$running" ]; then running=$entry; fi
    done
    if [ "$line" != "$last" ]; then
      printf '[%4ds] %s\n' $((SECONDS - START)) "$line"
      last=$line
    fi
    if [ -n "$running" ]; then
      tail_line=$(last_complete_line "$LOG_DIR/scdino-${running% *}_${running#* }.out")
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

show_failure() {
  local step=$1 id=$2 state=$3
  echo "demo: step $step (job $id) ended $state; the end of its log:" >&2
  tail -n 30 "$LOG_DIR/scdino-${step}_${id}.out" >&2 || true
  exit 1
}

run_pipeline() {
  if run_finished && [ "$FORCE" != 1 ]; then
    say "pipeline: $RUN_DIR is complete, reusing it (DEMO_FORCE=1 reruns it)"
    return 0
  fi
  say "submitting the pipeline (logs in $LOG_DIR)"
  local -a jobs
  mapfile -t jobs < <(SCDINO_LOG_DIR=$LOG_DIR slurm/submit_pipeline.sh "$CONFIG")
  [ "${#jobs[@]}" -gt 0 ] || die "nothing submitted"
  printf '  %s\n' "${jobs[@]}"
  printf '%s\n' "${jobs[@]}" >"$LOG_DIR/jobs.txt"
  PIPELINE_RAN=1
  say "following the jobs"
  follow "${jobs[@]}"
}

# The run summary (results.json): kNN of the trained model and both baselines, each step's time in
# Python and as a Slurm job; job and wall times only when this call ran the pipeline.
write_results() {
  say "results"
  local -a args=(--config "$CONFIG")
  ((PIPELINE_RAN)) && args+=(--jobs "$LOG_DIR/jobs.txt" --wall-seconds "$((SECONDS - START))")
  "$PYTHON" -m training summary "${args[@]}"
}

synth_cdk() {
  [ -f app.py ] || { say "CDK app: app.py not present, skipping cdk synth"; return 0; }
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

#!/usr/bin/env bash
# The body of `make screen`: the synthetic screen from whole fields of view to kNN, through the local
# Slurm cluster, as `make demo` runs the class-folder data.
#   1. write the synthetic screen (python -m training synth-data --screen: fields of view, label
#      masks, load_data.csv), unless its load table exists
#   2. run scripts/demo.sh with configs/screen.yaml: the chain starts with ingest (the config sets
#      ingest.table), then mean-std, pretrain, features, labels, knn, linear, export, plots, report; then
#      results.json and the kNN table (plain and not-same-batch, labels Metadata_Treatment)
# Settings: SCREEN_CONFIG (configs/screen.yaml), and scripts/demo.sh's DEMO_FORCE and SLURM_LOCAL_*.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
CONFIG=${SCREEN_CONFIG:-configs/screen.yaml}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PYTHON" ] || { echo "screen: error: no virtualenv at $PYTHON: run \`make screen\` (it installs first)" >&2; exit 1; }
TABLE=$("$PYTHON" -m training paths --config "$CONFIG" --ingest-table)
[ -n "$TABLE" ] || { echo "screen: error: $CONFIG sets no ingest.table" >&2; exit 1; }
if [ ! -f "$TABLE" ]; then
  printf '\n== synthetic screen -> %s\n' "$(dirname "$TABLE")"
  "$PYTHON" -m training synth-data --screen --config "$CONFIG" --out "$(dirname "$TABLE")"
fi
DEMO_CONFIG=$CONFIG exec scripts/demo.sh

#!/usr/bin/env bash
# Every GPU figure docs/performance.md asks for, as JSON files in OUT_DIR, in two parts that each fit
# a short lease of a GPU machine, the most important first:
#   GPU_BENCH_PART=1 GPU_BENCH_BUDGET=390 scripts/gpu-bench.sh OUT_DIR   # part 1 in 6.5 minutes
#   scripts/gpu-bench.sh OUT_DIR                      # both parts
#   srun --gpus=1 scripts/gpu-bench.sh OUT_DIR        # on the cluster
#   GPU_BENCH_SMOKE=1 scripts/gpu-bench.sh OUT_DIR    # tiny sizes, runs on a CPU (what the tests check)
# Part 1: correctness (pytest -m gpu: bf16 and fp16 against fp32, no host synchronisation in
#   pretrain's loop, the CUDA multi-crop against the CPU path, DDP and FSDP2 through NCCL); then
#   `bench pretrain` (pretrain's loop beside the same model's free-running step) for ViT-S/16 at
#   scDINO's crops (2 x 224 + 8 x 96, 5 channels) eager, compiled and compiled with CUDA graphs
#   (train.compile_mode=reduce-overhead), and the same three for ViT-S/8 at the cells' native
#   resolution (configs/fast.yaml's recipe); `bench step` for ViT-S/16 eager (its time split: the
#   optimizer's share); the loader at scDINO's crops; the demo's chain (synthetic cells, prepare,
#   mean-std, pretrain, features, labels, kNN) on the GPU.
# Part 2: ViT-S/16 as DINO's reference code runs it, ViT-B/16 eager and compiled, the bag of
#   channels, the loader at native resolution, and `bench pretrain` of compiled ViT-S/16 from the
#   real loader with the multi-crop on the GPU (data.gpu_augment).
# Each stage writes its own file and a failed or timed-out stage does not stop the next (stages.txt
# says which); GPU_BENCH_SKIP="step_vits16_224 loader_224" leaves stages out (their names, spaces as
# underscores), e.g. those a first lease measured; GPU_BENCH_BUDGET=SECONDS bounds the whole run:
# each stage gets at most what is left, and a stage that would start with less than
# BENCH_STAGE_MIN (30) seconds left is skipped (noted in stages.txt), so the summary is written in
# time; GPU_BENCH_BUNDLE=FILE.tar re-writes a tar of OUT_DIR after every stage, so a run cut short
# still leaves what it measured. summary.json sums up whatever files are there.
# Settings: BENCH_BATCH (images per step, 128), BENCH_STEPS (timed steps, 30), BENCH_WARMUP (untimed
# steps first, 3: enough for cuDNN autotuning and torch.compile), BENCH_STAGE_TIMEOUT (seconds per
# stage, 600), PYTHON.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:?usage: scripts/gpu-bench.sh OUT_DIR}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
SMOKE=${GPU_BENCH_SMOKE:-0}
PART=${GPU_BENCH_PART:-all}
BUNDLE=${GPU_BENCH_BUNDLE:-}
SKIP=${GPU_BENCH_SKIP:-}
BUDGET=${GPU_BENCH_BUDGET:-}
STAGE_MIN=${BENCH_STAGE_MIN:-30}
BATCH=${BENCH_BATCH:-128}
STEPS=${BENCH_STEPS:-30}
WARMUP=${BENCH_WARMUP:-3}
STAGE_TIMEOUT=${BENCH_STAGE_TIMEOUT:-600}

die() { echo "gpu-bench: error: $*" >&2; exit 1; }
case "$PART" in 1|2|all) ;; *) die "GPU_BENCH_PART=$PART: give 1, 2 or all" ;; esac
case "$BUDGET" in ""|*[!0-9]*) [ -z "$BUDGET" ] || die "GPU_BENCH_BUDGET=$BUDGET: give whole seconds" ;; esac
DEADLINE=$(( $(date +%s) + ${BUDGET:-999999} ))
[ -x "$PYTHON" ] || command -v "$PYTHON" >/dev/null || die "no Python at $PYTHON: run \`make install\` or set PYTHON"
mkdir -p "$OUT" || die "cannot create $OUT"
OUT=$(cd "$OUT" && pwd)
[ -z "$BUNDLE" ] || BUNDLE=$(cd "$(dirname "$BUNDLE")" && pwd)/$(basename "$BUNDLE")
cd "$REPO" || exit 1

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  [ "$SMOKE" = 1 ] || die "no CUDA GPU visible to torch (nvidia-smi, CUDA_VISIBLE_DEVICES); GPU_BENCH_SMOKE=1 runs the tiny CPU version"
fi

# The settings. Full size: scDINO's crops, 5 channels, bf16 where the GPU has it; smoke: the same
# code paths at toy sizes.
if [ "$SMOKE" = 1 ]; then
  BATCH=2 STEPS=1 WARMUP=0
  COMMON="data.channels=01234 model.out_dim=64 dino.local_crops_number=2 dino.global_crop_size=16 dino.local_crop_size=8"
  S16="model.arch=vit_tiny model.patch_size=8"
  B16="model.arch=vit_tiny model.patch_size=8"
  S8="model.arch=vit_tiny model.patch_size=8 dino.global_crop_size=8 dino.local_crop_size=8"
  LOADER=(--images 40 --batches 1 --warmup 0 --workers 1)
  WORKERS=1
  NATIVE_SIZE=8/8
  CHAIN="--per-class 12 --size 24|optim.epochs=1 eval.image_size=16 dino.global_crop_size=16 dino.local_crop_size=8"
else
  COMMON="data.channels=01234"
  S16="model.arch=vit_small model.patch_size=16"
  B16="model.arch=vit_base model.patch_size=16"
  S8="model.arch=vit_small model.patch_size=8 dino.global_crop_size=48 dino.local_crop_size=24"
  workers=$(( $(nproc) > 8 ? 8 : $(nproc) ))
  LOADER=(--images $(( (WARMUP + 20) * BATCH + BATCH )) --batches 20 --warmup 3 --workers "$workers")
  WORKERS=$workers
  NATIVE_SIZE=48/24
  # the demo's set (400 images per class) and global batch (2 ranks x 16), on one GPU
  CHAIN="--per-class 400|data.num_workers=$workers train.precision=auto optim.batch_size_per_gpu=32"
fi

sets() { local kv; for kv in $COMMON $1 "optim.batch_size_per_gpu=$BATCH"; do printf -- '--set\n%s\n' "$kv"; done; }

bundle() { if [ -n "$BUNDLE" ]; then tar -cf "$BUNDLE.part" -C "$OUT" . && mv "$BUNDLE.part" "$BUNDLE"; fi; }

# stage NAME COMMAND...: run one stage under the stage time limit, note how it ended, bundle.
# COMMAND may be one of this script's functions (exported below).
stage() {
  local name=$1 start rc left limit; shift
  case " $SKIP " in *" ${name// /_} "*) echo "== $name: skipped (GPU_BENCH_SKIP)" >&2; return 0 ;; esac
  start=$(date +%s)
  left=$(( DEADLINE - start ))
  if [ "$left" -lt "$STAGE_MIN" ]; then
    echo "== $name: skipped (GPU_BENCH_BUDGET: ${left}s left)" >&2
    printf '%s\tskipped (budget)\t0s\n' "$name" >> "$OUT/stages.txt"
    return 0
  fi
  limit=$(( left < STAGE_TIMEOUT ? left : STAGE_TIMEOUT ))
  echo "== $name" >&2
  if [ "$(type -t "$1")" = function ]; then
    timeout --kill-after=10 "$limit" bash -c "$*"
  else
    timeout --kill-after=10 "$limit" "$@"
  fi
  rc=$?
  printf '%s\t%s\t%ss\n' "$name" "$([ $rc = 0 ] && echo ok || echo "failed ($rc)")" "$(( $(date +%s) - start ))" >> "$OUT/stages.txt"
  [ $rc = 0 ] || echo "gpu-bench: stage $name failed ($rc); going on" >&2
  bundle
}

step() {  # step NAME "SETTINGS" [bench flags...]
  local name=$1 settings=$2 args; shift 2
  mapfile -t args < <(sets "$settings")
  stage "step $name" "$PYTHON" -m training bench step --batches "$STEPS" --warmup "$WARMUP" "${args[@]}" "$@" \
    --out "$OUT/step_$name.json" >/dev/null
}

pretrain() {  # pretrain NAME "SETTINGS" [bench flags...]: pretrain's loop beside the same model's step
  local name=$1 settings=$2 args; shift 2
  mapfile -t args < <(sets "$settings")
  stage "pretrain $name" "$PYTHON" -m training bench pretrain --batches "$STEPS" --warmup "$(( WARMUP > 0 ? WARMUP : 1 ))" "${args[@]}" "$@" \
    --out "$OUT/pretrain_$name.json" >/dev/null
}

loader() {  # loader NAME SIZE
  local args size=()
  mapfile -t args < <(sets "")
  [ -z "$2" ] || size=(--size "$2")
  stage "loader $1" "$PYTHON" -m training bench loader "${LOADER[@]}" "${size[@]}" "${args[@]}" --out "$OUT/loader_$1.json" >/dev/null
}

gpu_tests() {
  "$PYTHON" -m pytest -m gpu -q -s -p no:cacheprovider tests/training/test_gpu.py tests/training/data/loading/test_torch_loader.py \
    > "$OUT/gpu_tests.txt" 2>&1
}

chain() {  # the demo's chain at the demo's size on this machine: does it run and learn here?
  local run=$WORK/chain synth=${CHAIN%%|*} args kv s
  args=(--config configs/demo.yaml --set "run.output_dir=$run" --set "data.source=$run/data/images")
  for kv in ${CHAIN#*|}; do args+=(--set "$kv"); done
  # shellcheck disable=SC2086
  "$PYTHON" -m training synth-data "${args[@]}" $synth >/dev/null || return
  for s in prepare mean-std pretrain features labels knn; do
    "$PYTHON" -m training "$s" "${args[@]}" > "$WORK/chain_$s.log" 2>&1 || { tail -20 "$WORK/chain_$s.log" >&2; return 1; }
  done
  "$PYTHON" - "$run" "$OUT/chain.json" <<'PY'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
found = {str(p.relative_to(run)): json.loads(p.read_text()) for p in sorted(run.rglob("knn*.json"))}
metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] if (run / "metrics.jsonl").exists() else []
epochs = [m for m in metrics if m.get("kind") == "epoch"]
json.dump({"knn": found, "epochs": epochs}, open(sys.argv[2], "w"), indent=2)
PY
}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PYTHON OUT WORK CHAIN
export -f gpu_tests chain
: > "$OUT/stages.txt"

"$PYTHON" - "$OUT/device.json" <<'PY'
import json, os, platform, sys, torch
cuda = torch.cuda.is_available()
info = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(), "cpus": os.cpu_count(),
        "gpus": torch.cuda.device_count() if cuda else 0}
json.dump(info, open(sys.argv[1], "w"), indent=2)
print(f"device: {info['device']} (torch {info['torch']}, {info['gpus']} GPU(s), {info['cpus']} CPUs)")
PY
bundle

# Compiled stages only on a GPU: inductor on a CPU takes minutes. GRAPHS: CUDA graphs of the compiled step.
COMPILED="train.compile=true"
GRAPHS="train.compile=true train.compile_mode=reduce-overhead"
if [ "$PART" != 2 ]; then
  [ "$SMOKE" = 1 ] || stage "pytest -m gpu" gpu_tests
  pretrain vits16_224 "$S16"
  [ "$SMOKE" = 1 ] || pretrain vits16_224_compiled "$S16 $COMPILED"
  [ "$SMOKE" = 1 ] || pretrain vits16_224_graphs "$S16 $GRAPHS"
  pretrain vits8_native "$S8"
  [ "$SMOKE" = 1 ] || pretrain vits8_native_compiled "$S8 $COMPILED"
  [ "$SMOKE" = 1 ] || pretrain vits8_native_graphs "$S8 $GRAPHS"
  step vits16_224 "$S16"
  loader 224 ""
  stage chain chain
fi
if [ "$PART" != 1 ]; then
  step vits16_224_reference "$S16" --dino-reference
  step vitb16_224 "$B16"
  [ "$SMOKE" = 1 ] || step vitb16_224_compiled "$B16 $COMPILED"
  step vits8_native_bag "$S8 model.kind=bag_of_channels"
  loader native "$NATIVE_SIZE"
  if [ "$SMOKE" = 1 ]; then
    pretrain vits16_224_packed "$S16 data.gpu_augment=true data.num_workers=$WORKERS" --loader packed
  else
    pretrain vits16_224_compiled_packed "$S16 $COMPILED data.gpu_augment=true data.num_workers=$WORKERS" --loader packed
  fi
fi

"$PYTHON" -m training.benchmarks.speed.gpu_summary "$OUT" || die "could not sum up $OUT"
bundle

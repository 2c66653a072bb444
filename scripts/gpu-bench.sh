#!/usr/bin/env bash
# Every GPU figure docs/performance.md asks for, in one command, as JSON files in OUT_DIR:
#   scripts/gpu-bench.sh OUT_DIR                      # on a GPU node (about 10 minutes on one H100)
#   srun --gpus=1 scripts/gpu-bench.sh OUT_DIR        # on the cluster
#   GPU_BENCH_SMOKE=1 scripts/gpu-bench.sh OUT_DIR    # tiny sizes, runs on a CPU (what the tests check)
# Writes device.json, step_<setting>.json (ViT-S/16 and ViT-B/16 at scDINO's crops, eager and
# compiled, and ViT-S/8 at the cells' native resolution), loader_224.json and loader_native.json
# (baseline, packed, device-side multi-crop, DALI), scaling_vits16_224.json (the multi-node model of
# training/benchmarks/scaling.py fed the ViT-S/16 step), gpu_tests.txt (pytest -m gpu) and summary.json.
# Settings: BENCH_BATCH (images per step, 64), BENCH_STEPS (timed steps, 30), BENCH_WARMUP (untimed
# steps first, 3: enough for cuDNN autotuning and torch.compile), PYTHON.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:?usage: scripts/gpu-bench.sh OUT_DIR}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
SMOKE=${GPU_BENCH_SMOKE:-0}
BATCH=${BENCH_BATCH:-64}
STEPS=${BENCH_STEPS:-30}
WARMUP=${BENCH_WARMUP:-3}

die() { echo "gpu-bench: error: $*" >&2; exit 1; }
[ -x "$PYTHON" ] || die "no Python at $PYTHON: run \`make install\` or set PYTHON"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$REPO"

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  [ "$SMOKE" = 1 ] || die "no CUDA GPU visible to torch (nvidia-smi, CUDA_VISIBLE_DEVICES); GPU_BENCH_SMOKE=1 runs the tiny CPU version"
fi

# The settings, as `name|--set overrides` lines. Full size: scDINO's crops, 5 channels, bf16 where
# the GPU has it; smoke: the same code paths at toy sizes.
if [ "$SMOKE" = 1 ]; then
  BATCH=2 STEPS=1 WARMUP=0
  COMMON="data.channels=01234 model.out_dim=64 dino.local_crops_number=2 dino.global_crop_size=16 dino.local_crop_size=8"
  SETTINGS=("vits16_224|model.arch=vit_tiny model.patch_size=8"
            "vits8_native|model.arch=vit_tiny model.patch_size=8 dino.global_crop_size=8 dino.local_crop_size=8")
  LOADER=(--images 40 --batches 1 --warmup 0 --workers 1)
  NATIVE_SIZE=8/8
else
  COMMON="data.channels=01234"
  SETTINGS=("vits16_224|model.arch=vit_small model.patch_size=16"
            "vits16_224_compiled|model.arch=vit_small model.patch_size=16 train.compile=true"
            "vitb16_224|model.arch=vit_base model.patch_size=16"
            "vitb16_224_compiled|model.arch=vit_base model.patch_size=16 train.compile=true"
            "vits8_native|model.arch=vit_small model.patch_size=8 dino.global_crop_size=48 dino.local_crop_size=24")
  LOADER=(--images 2000 --batches 20 --warmup 3 --workers "$(( $(nproc) > 8 ? 8 : $(nproc) ))")
  NATIVE_SIZE=48/24
fi

sets() { local kv; for kv in $COMMON $1 "optim.batch_size_per_gpu=$BATCH"; do printf -- '--set\n%s\n' "$kv"; done; }

"$PYTHON" - "$OUT/device.json" <<'PY'
import json, os, platform, sys, torch
cuda = torch.cuda.is_available()
info = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(), "cpus": os.cpu_count(),
        "gpus": torch.cuda.device_count() if cuda else 0}
json.dump(info, open(sys.argv[1], "w"), indent=2)
print(f"device: {info['device']} (torch {info['torch']}, {info['gpus']} GPU(s), {info['cpus']} CPUs)")
PY

for entry in "${SETTINGS[@]}"; do
  name=${entry%%|*}
  mapfile -t args < <(sets "${entry#*|}")
  echo "== bench step: $name"
  "$PYTHON" -m training bench step --batches "$STEPS" --warmup "$WARMUP" "${args[@]}" --out "$OUT/step_$name.json" >/dev/null
done

echo "== scaling model: vits16_224"
"$PYTHON" -m training.benchmarks.scaling --step-json "$OUT/step_vits16_224.json" > "$OUT/scaling_vits16_224.json"

mapfile -t args < <(sets "")
echo "== bench loader: 2 x 224 + 8 x 96"
"$PYTHON" -m training bench loader "${LOADER[@]}" "${args[@]}" --out "$OUT/loader_224.json" >/dev/null
echo "== bench loader: native resolution ($NATIVE_SIZE)"
"$PYTHON" -m training bench loader "${LOADER[@]}" --size "$NATIVE_SIZE" "${args[@]}" --out "$OUT/loader_native.json" >/dev/null

if [ "$SMOKE" != 1 ]; then
  echo "== pytest -m gpu"
  "$PYTHON" -m pytest -m gpu -q -p no:cacheprovider tests/training > "$OUT/gpu_tests.txt" 2>&1 ||
    echo "gpu-bench: some GPU tests failed: see $OUT/gpu_tests.txt" >&2
fi

"$PYTHON" - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
summary = {"device": json.loads((out / "device.json").read_text()), "step": {}, "loader": {}}
for path in sorted(out.glob("step_*.json")):
    step = json.loads(path.read_text())
    summary["step"][path.stem[5:]] = {k: step[k] for k in ("images_per_s", "mfu", "achieved_tflops", "step_time_s",
                                                           "split_step_time_s", "peak_memory_gb", "precision", "batch_size")}
for path in sorted(out.glob("loader_*.json")):
    loader = json.loads(path.read_text())
    summary["loader"][path.stem[7:]] = {
        "crops": loader["settings"]["crops"], "baseline_images_per_s": loader["baseline_scdino_style_images_per_s"],
        "packed_images_per_s": loader["packed_batched_images_per_s"],
        "device_augment_images_per_s": loader["device_augment"]["images_per_s"],
        "dali_images_per_s": loader.get("dali_images_per_s"), "dali_device": loader.get("dali_device")}
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
for name, step in summary["step"].items():
    print(f"step   {name:22s} {step['images_per_s']:10.1f} images/s   MFU {step['mfu']}")
for name, loader in summary["loader"].items():
    print(f"loader {name:22s} packed {loader['packed_images_per_s']:.1f}, device {loader['device_augment_images_per_s']:.1f}, "
          f"DALI {loader['dali_images_per_s']} images/s")
print(f"figures: {out}/summary.json")
PY

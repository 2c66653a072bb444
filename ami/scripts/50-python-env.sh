#!/usr/bin/env bash
# A Python 3.11 environment in /opt/scdino-venv with torch, torchvision and the DALI wheel
# built for the image's CUDA major version (DALI publishes one package per CUDA major).
set -euo pipefail

: "${TORCH_VERSION:?}" "${TORCHVISION_VERSION:?}"
readonly VENV=/opt/scdino-venv

if ! command -v python3.11 >/dev/null; then
  if command -v dnf >/dev/null; then
    dnf install -y -q python3.11 python3.11-pip
  else
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3.11 python3.11-venv
  fi
fi
cuda_major=$(/usr/local/cuda/bin/nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
[[ -n "${cuda_major}" ]] || { echo "cannot read the CUDA version from nvcc" >&2; exit 1; }
dali_package="nvidia-dali-cuda${cuda_major}0"

python3.11 -m venv "${VENV}"
pip=("${VENV}/bin/pip" install --disable-pip-version-check --no-input -q)
"${pip[@]}" --upgrade pip
"${pip[@]}" "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"
"${pip[@]}" --extra-index-url https://pypi.nvidia.com "${dali_package}"
"${VENV}/bin/python" - <<'PY'
import torch, torchvision
from nvidia import dali
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), torchvision {torchvision.__version__}, DALI {dali.__version__}")
assert torch.cuda.is_available(), "torch sees no GPU"
PY

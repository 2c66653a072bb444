#!/usr/bin/env bash
# A Python 3.11 environment in /opt/scdino-venv with torch, torchvision and the DALI wheel
# built for torch's CUDA major version (DALI publishes one package per CUDA major, and it must
# match the CUDA runtime torch ships, not the toolkit in /usr/local/cuda).
set -euo pipefail

: "${TORCH_VERSION:?}" "${TORCHVISION_VERSION:?}"
readonly DALI_VERSION="${DALI_VERSION:-2.4.0}"
readonly VENV=/opt/scdino-venv

if ! command -v python3.11 >/dev/null; then
  if command -v dnf >/dev/null; then
    dnf install -y -q python3.11 python3.11-pip
  else
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3.11 python3.11-venv
  fi
fi
python3.11 -m venv "${VENV}"
pip=("${VENV}/bin/pip" install --disable-pip-version-check --no-input -q)
"${pip[@]}" --upgrade pip
"${pip[@]}" "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"
cuda_major=$("${VENV}/bin/python" -c 'import torch; print((torch.version.cuda or "").split(".")[0])')
[[ -n "${cuda_major}" ]] || { echo "torch ${TORCH_VERSION} is not a CUDA build: cannot choose a DALI package" >&2; exit 1; }
"${pip[@]}" "nvidia-dali-cuda${cuda_major}0==${DALI_VERSION}"
"${VENV}/bin/python" - <<'PY'
import torch, torchvision
from nvidia import dali
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), torchvision {torchvision.__version__}, DALI {dali.__version__}")
assert torch.cuda.is_available(), "torch sees no GPU"
PY
